"""A flood of notifications does not multiply background work (issue 45, bounded under floods).

Round 5 left, after 10,000 Alertmanager bodies, 1,657 background tasks and 633 Slack messages
queued in a served bot: each new incident started its diagnosis at once, each notification a
delivery, however many already ran. Now a replica runs at most ``[server] max_diagnoses``
diagnoses and ``max_deliveries`` deliveries at once; past that the work stays owed in the store
(nothing is lost), ``ruleloop_background_shed_total`` counts it (the RuleloopShedding alert),
and the outbox job runs the owed diagnoses, as many at a time, and sends the owed messages.

The burst is sent all at once through the bot's real webhook route (the slack-bolt app and its
Slack at the wire, FakeSlack); each alert names no target, so each opens its own incident whose
diagnosis fails at once ("no target") and owes two messages: the worst case for task count.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from bot.kernel.store import Incident
from tests import store_reads
from tests.fakes.alerts import alert, payload
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import FakeSlack

BURST = 300
LIMITS = {"max_diagnoses": 2, "max_deliveries": 4}


def body(i: int) -> bytes:
    """A notification of its own group, for no configured target."""
    sent: dict[str, Any] = payload(
        alert(instance=f"10.9.{i // 250}.{i % 250}:8000", fingerprint=f"{i:016x}"),
        group_key=f'{{}}:{{instance="burst-{i}"}}',
    )  # fmt: skip
    return json.dumps(sent).encode()


def diagnosed(h: Harness) -> int:
    with h.bot.db.transaction() as s:
        done = [e for e in store_reads.audit_trail(s) if e.action.startswith("diagnosis.")]
        return len({e.incident_id for e in done})


def incidents(h: Harness) -> int:
    with h.bot.db.transaction() as s:
        return int(s.scalar(select(func.count()).select_from(Incident)) or 0)


def shed_metric(h: Harness, group: str) -> float:
    for line in h.bot.metrics.exposition().decode().splitlines():
        if line.startswith(f'ruleloop_background_shed_total{{group="{group}"}}'):
            return float(line.split()[-1])
    return 0.0


async def burst(h: Harness) -> None:
    answers = await asyncio.gather(*(h.webhook(body(i)) for i in range(BURST)))
    assert {a.status_code for a in answers} <= {200, 202}, {a.text for a in answers}


async def test_a_burst_runs_at_most_the_limits_and_the_rest_stays_owed(
    tmp_path: Path, slack: FakeSlack
) -> None:
    h = harness(tmp_path, slack=slack, server=LIMITS)
    try:
        await burst(h)
        tasks = h.bot.tasks
        # what runs: at most the limits (was one task per notification: BURST)
        assert tasks.running("diagnosis") <= 2 and tasks.running("delivery") <= 4
        assert tasks.pending <= 2 + 4, tasks.pending
        shed = tasks.shed["diagnosis"]
        assert shed > BURST // 2 and shed_metric(h, "diagnosis") == shed
        assert incidents(h) == BURST  # every notification kept
        await tasks.drain()
        assert diagnosed(h) < BURST  # the shed ones wait for the outbox job
        # the outbox job, as the scheduler runs it: max_diagnoses at a time, the next as one ends
        runs = 0
        while diagnosed(h) < BURST or h.bot.flows.outbox.counts().get("pending", 0):
            runs += 1
            assert runs <= BURST, "the outbox job does not drain the owed work"
            h.wall.advance(61)  # older than REDIAGNOSE_AFTER
            await h.bot.flows.sweep()
            await tasks.drain()
        # nothing lost: every incident diagnosed (here: "no target") and announced in Slack
        assert diagnosed(h) == BURST
        roots = [c for c in slack.of("chat.postMessage") if "thread_ts" not in c.args]
        assert len(roots) == BURST
    finally:
        await h.close()


async def test_under_the_limits_nothing_is_shed(tmp_path: Path, slack: FakeSlack) -> None:
    """The bad case of the gate: a burst the limits hold whole is run at once, none shed."""
    h = harness(tmp_path, slack=slack, server={"max_diagnoses": 64, "max_deliveries": 64})
    try:
        answers = await asyncio.gather(*(h.webhook(body(i)) for i in range(20)))
        assert {a.status_code for a in answers} <= {200, 202}
        assert h.bot.tasks.shed == {} and shed_metric(h, "diagnosis") == 0.0
        await h.bot.tasks.drain()
        assert diagnosed(h) == 20
    finally:
        await h.close()


async def test_a_diagnosis_claimed_by_the_outbox_job_is_never_shed(
    tmp_path: Path, slack: FakeSlack
) -> None:
    """The race the 10,000-body bench found: the outbox job claims an owed diagnosis (a claim
    that holds for 15 minutes), and while it awaits the store, new incidents fill the group.
    Shed then, the incident stayed claimed and undiagnosed until the claim ran out (129 of
    10,000 did). A claimed one runs whatever the count."""
    h = harness(tmp_path, slack=slack, server={"max_diagnoses": 1, "max_deliveries": 4})
    try:
        tasks, flows = h.bot.tasks, h.bot.flows
        assert tasks.try_spawn(asyncio.sleep(0), name="owed", group="diagnosis", limit=1)
        await tasks.drain()
        answer = await h.webhook(body(0))
        assert answer.status_code in (200, 202)
        await tasks.drain()
        assert diagnosed(h) == 1
        # an incident whose diagnosis was shed at intake: owed, no claim
        tasks.try_spawn(asyncio.sleep(3600), name="busy", group="diagnosis", limit=1)
        assert (await h.webhook(body(1))).status_code in (200, 202)
        assert tasks.shed["diagnosis"] == 1
        claim = flows._records.claim_diagnosis
        gate = asyncio.Event()

        async def claim_while_the_group_fills(*args: Any, **kwargs: Any) -> bool:
            got = await claim(*args, **kwargs)
            gate.set()  # by now the busy task has finished and another filled the group
            tasks.try_spawn(asyncio.sleep(0.2), name="filler", group="diagnosis", limit=1)
            return got

        for task in [t for t in tasks._tasks if t.get_name() == "busy"]:
            task.cancel()
        await asyncio.sleep(0)
        flows._records.claim_diagnosis = claim_while_the_group_fills  # type: ignore[method-assign]
        h.wall.advance(61)
        await flows.sweep(budget_s=1.0)
        await tasks.drain()
        assert gate.is_set() and diagnosed(h) == 2  # the claimed one ran
    finally:
        await h.close()
