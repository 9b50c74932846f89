"""Scheduled jobs: baseline canary, metric snapshots, workload drift, ADR draft reminders,
approval expiry, and the outbox (Slack messages still owed, ``bot.incidents.outbox``).

Every replica runs APScheduler 3.x and fires every job's tick; which replica does a period's
work is decided in the store, by a lease row per (job, period).

    (bot/kernel/store/leases.py: claim, renew, finish and take over a period, ``job_runs``)
    runner.py     ``Job`` and ``JobRunner.tick``: one period under its lease, with a heartbeat
    scheduler.py  APScheduler wiring: one interval trigger per job, aligned to its periods
    rules_now.py  the rules in force, read for the diagnosis (it judges causes against them)
    baseline.py   canary against the gates of the ADRs in force; a drift opens an incident
    workload_drift.py  the live workload shape vs each ADR's; on drift, its gates re-run under it
    before_run.py  the flags a drifted ADR replaced, measured under the live shape (its before)
    revalidation.py  an ADR's gates re-run under the live shape (``Revalidation``)
    messages.py   what the jobs say in Slack
    snapshots.py  the numbers with a normal, every few minutes; "normal" for diagnoses
    reminders.py  one reminder in the thread for an ADR draft nobody reviewed
    jobs.py       the jobs a bot's settings ask for
"""
