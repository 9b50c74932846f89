"""Changing a target's engine: what every kind of change (a remediation, bot/remediation; a
tuning session, bot/tune/on_target.py; a drift before-run, bot/app/scheduler/before_run.py) uses to
set flags, hold the target, and check it still serves. Every change is a row of one table,
``changes`` (bot.kernel.store.models.Change, its ``kind`` saying which).

actuators/         where the flags are changed: local engine, Kubernetes Deployment, a commit
                   to the deployment repository (git), dry run
gitops/            changes that land as commits in a team's repository: git, pull requests
argv.py            reading and rewriting vLLM flags inside a command line
policy.py          who may request and approve; which ADRs and flags are allowed
exclusion.py       one change at a time per target, and the refusal naming who holds it
in_force.py        which ADRs are in force on a target: what the scheduled checks check, and
                   the standing gates a change there is watched against
rows.py            what the records of every kind share: one heartbeat, staleness, who holds
resume.py          one resume path: every silent change, of any kind, to its kind's restorer
liveness.py        which run owns a change, and how it shows it is alive
serving.py         after a change or a restore: the engine serves a completion, not just /health
"""
