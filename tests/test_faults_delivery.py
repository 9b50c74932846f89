"""Slack unreachable while incidents open (docs/reliability.md, item 2), through the real bot:
the webhook over ASGI, real SQLite (and PostgreSQL for the replicas), the fake Slack Web API
taken down at the wire (503s, refused connections) or refusing a channel. Time is simulated:
the outbox job is ticked on the bot's wall clock, nothing sleeps for minutes."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from bot.app.cli import cli
from bot.app.scheduler.runner import Job
from bot.kernel.store import outbox as items
from bot.kernel.store.models import OutboxItem, SlackMessage
from tests import store_reads
from tests.fakes.alerts import alert, body
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import Call, FakeSlack
from tests.test_bot_store import postgres  # noqa: F401  (the real PostgreSQL server fixture)

pytestmark = pytest.mark.faults

INCIDENTS = 20
THREAD = ("chat.postMessage", "files.completeUploadExternal")


def job(h: Harness, name: str) -> Job:
    assert h.bot.scheduler is not None
    return next(j for j in h.bot.scheduler.jobs if j.name == name)


async def tick(h: Harness, *, after_s: float) -> dict[str, Any]:
    """Move the bot's wall clock on, then run one period of the outbox job, as APScheduler
    would on this replica; what it did."""
    assert h.bot.scheduler is not None
    h.wall.advance(after_s)
    (result,) = await h.bot.scheduler.runner.tick(job(h, "outbox"))
    await h.bot.tasks.drain()
    return dict(result.detail)


# One target per incident: the alert groups of one target are one incident (bot/incidents/intake)
TARGETS = {
    f"prod-{n}": {"vllm_url": f"http://10.0.0.5:80{n:02d}", "actuator": {"kind": "dry-run"}}
    for n in range(INCIDENTS)
}


def incident_body(n: int) -> bytes:
    """Incident ``n``: an alert group of its own, about target prod-``n``."""
    instance = f"10.0.0.5:80{n:02d}"
    return body(
        alert(instance=instance, fingerprint=f"{n:016x}", ruleloop_target=f"prod-{n}"),
        group_key=f'{{}}:{{instance="{instance}"}}',
        groupLabels={"alertname": "VLLMTimeToFirstTokenP99High", "instance": instance},
    )


def roots(slack: FakeSlack) -> list[Call]:
    """Root messages Slack took (a chat.postMessage outside any thread)."""
    return [c for c in slack.of("chat.postMessage") if not c.args.get("thread_ts")]


def per_thread(slack: FakeSlack) -> Counter[str]:
    """Thread messages Slack took, per thread ts."""
    return Counter(
        str(c.args["thread_ts"]) for c in slack.of("chat.postMessage") if c.args.get("thread_ts")
    )


def audit(h: Harness) -> Counter[str]:
    with h.bot.db.transaction() as s:
        return Counter(e.action for e in store_reads.audit_trail(s))


def outbox(h: Harness) -> list[OutboxItem]:
    with h.bot.db.transaction() as s:
        return list(s.scalars(select(OutboxItem).order_by(OutboxItem.id)).all())


@pytest.fixture
async def h(tmp_path: Path, slack: FakeSlack) -> Any:
    harness_ = harness(tmp_path, slack=slack, matching_adr=True, targets=TARGETS)
    yield harness_
    await harness_.close()


async def test_slack_down_two_minutes_during_20_openings_then_each_posted_and_diagnosed_once(
    h: Harness, slack: FakeSlack
) -> None:
    """Item 2: the background task failed and was only logged; the repeat was a duplicate;
    after Slack recovered there were 0 messages and 0 diagnoses, forever."""
    slack.outage("5xx")
    for n in range(INCIDENTS):
        answer = await h.webhook(incident_body(n))
        assert (answer.status_code, answer.json()["outcome"]) == (202, "opened")
    await h.bot.tasks.drain()
    assert slack.of("chat.postMessage") == [] and len(slack.calls) >= INCIDENTS  # really down
    assert audit(h)["diagnosis.finished"] == INCIDENTS  # measured at once, Slack or not
    # Alertmanager repeats one: not dropped, its messages are tried again
    repeat = await h.webhook(incident_body(3))
    assert repeat.json()["outcome"] == "duplicate"
    assert "not delivered yet, tried again now" in repeat.json()["reason"]
    for _ in range(8):  # two minutes down, the outbox job every 15 s
        done = await tick(h, after_s=15)
        assert done["sent"] == 0 and done["slack_failing"]
        assert done["retried"] == 1  # one probe per round while Slack fails, not one per message
    slack.recover()
    done = await tick(h, after_s=15)  # the next round sends everything, backoff or not
    assert done == {**done, "pending": 0, "failed": 0, "retried": 0}
    posted = roots(slack)
    assert len(posted) == INCIDENTS  # each root message exactly once
    titles = Counter(c.args["text"] for c in posted)
    assert len(titles) == INCIDENTS and set(titles.values()) == {1}
    threads = per_thread(slack)
    root_ts = set(_posted_ts(slack))
    assert len(root_ts) == INCIDENTS and set(threads) == root_ts
    assert set(threads.values()) == {3}  # findings, the matching ADRs and the buttons, once each
    assert len(slack.of("files.completeUploadExternal")) == INCIDENTS  # one chart each
    actions = audit(h)
    assert actions["slack.root_posted"] == actions["diagnosis.posted"] == INCIDENTS
    assert actions["diagnosis.finished"] == actions["diagnosis.chart_posted"] == INCIDENTS
    with h.bot.db.transaction() as s:
        kept = s.scalars(select(SlackMessage).where(SlackMessage.kind == "root")).all()
        assert len({m.incident_id for m in kept}) == len(kept) == INCIDENTS
    shown = [slack.messages[("C0INCIDENTS", ts)] for ts in root_ts]
    assert all("diagnosed" in str(m["blocks"]) for m in shown)  # the numbers, not "diagnosing"


def _posted_ts(slack: FakeSlack) -> list[str]:
    """The ts Slack gave each root message, in the order they were posted."""
    return [ts for (_, ts), m in slack.messages.items() if not m.get("thread_ts")]


async def test_refused_connections_are_retried_and_a_repeat_triggers_delivery(
    h: Harness, slack: FakeSlack
) -> None:
    """The port closed (connection refused), not a 5xx: the same, and Alertmanager's repeat
    delivers at once, before the outbox job's next round."""
    slack.outage("refuse")
    assert (await h.webhook(incident_body(1))).status_code == 202
    await h.bot.tasks.drain()
    (root, *_) = outbox(h)
    assert root.kind == "root" and root.state == "pending" and root.attempts == 1
    assert "Slack unreachable" in (root.last_error or "")
    slack.recover()
    repeat = await h.webhook(incident_body(1))  # before the job ticks again
    assert "tried again now" in repeat.json()["reason"]
    await slack.until("chat.update")
    await h.bot.tasks.drain()
    assert len(roots(slack)) == 1 and set(per_thread(slack).values()) == {3}


async def test_a_channel_slack_refuses_is_failed_with_the_reason_not_retried_forever(
    tmp_path: Path, slack: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """A permanent refusal (channel_not_found) is marked failed, logged, audited, counted on
    /metrics and shown on /healthz; the outbox job never tries it again."""
    slack.missing.add("#gone")
    h = harness(tmp_path, slack=slack, slack_extra={"channel": "#gone"}, targets=TARGETS)
    try:
        with caplog.at_level(logging.ERROR, logger="ruleloop.outbox"):
            assert (await h.webhook(incident_body(1))).status_code == 202
            await h.bot.tasks.drain()
        for _ in range(10):
            await tick(h, after_s=300)
        refused = [c for c in slack.calls if c.method == "chat.postMessage"]
        assert [c.status for c in refused] == [400]  # tried once
        (root, *rest) = outbox(h)
        assert (root.state, root.last_error) == (
            "failed",
            "Slack refused the incident message in #gone: channel_not_found",
        )
        assert rest and {i.state for i in rest if i.kind != "diagnose"} == {"failed"}
        assert "channel_not_found" in caplog.text
        assert audit(h)["slack.delivery_failed"] == 1
        assert audit(h)["diagnosis.finished"] == 1  # the numbers are kept
        health = (await h.client.get("/healthz")).json()
        messages = [i for i in outbox(h) if i.kind != "diagnose"]
        assert health["slack_messages"] == {"pending": 0, "failed": len(messages)}
        metrics = (await h.client.get("/metrics")).text
        assert 'ruleloop_slack_deliveries_total{kind="root",outcome="failed"} 1.0' in metrics
        listed = CliRunner().invoke(
            cli,
            ["db", "deliveries", "--state-dir", str(tmp_path / "state")],
            env={"RULELOOP_CONFIG": "", "RULELOOP_DATABASE_URL": ""},
        )
        assert listed.exit_code == 0, listed.output
        assert f"0 pending, {len(messages)} failed" in listed.output
        assert (
            "incident 1 root (failed 2026-11-29 02:00 UTC, 1 tries): Slack refused the "
            "incident message in #gone: channel_not_found" in listed.output
        )
    finally:
        await h.close()


async def test_an_incident_whose_process_stopped_is_posted_and_diagnosed_by_the_next_one(
    tmp_path: Path, slack: FakeSlack
) -> None:
    """The webhook was answered 202, then the process stopped before anything reached Slack:
    the next process (or replica) posts the root message and runs the diagnosis."""
    first = harness(tmp_path, slack=slack, matching_adr=True, targets=TARGETS)
    slack.outage("5xx")
    assert (await first.webhook(incident_body(1))).status_code == 202
    await first.bot.tasks.drain(timeout_s=0)  # stopped: the diagnosis is cancelled
    await first.close()
    slack.recover()
    second = harness(tmp_path, slack=slack, matching_adr=True, targets=TARGETS)  # the same store
    try:
        await tick(second, after_s=15)
        done = await tick(second, after_s=16 * 60)  # the stopped process's claim ran out
        assert done["rediagnosed"] == [1]
        await second.bot.tasks.drain()
        await tick(second, after_s=15)
        assert len(roots(slack)) == 1 and set(per_thread(slack).values()) == {3}
        assert audit(second)["diagnosis.finished"] == 1
    finally:
        await second.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_two_replicas_delivering_at_once_send_each_message_once(
    tmp_path: Path, slack: FakeSlack, request: pytest.FixtureRequest, backend: str
) -> None:
    """Several replicas: each message is claimed by one (a conditional UPDATE), in order."""
    extra: dict[str, Any] = {}
    if backend == "postgresql":
        from tests.test_migrations import new_url

        extra["store"] = {"url": new_url(request, tmp_path, backend)}
    a = harness(tmp_path, slack=slack, matching_adr=True, targets=TARGETS, **extra)
    b = harness(tmp_path, slack=slack, matching_adr=True, targets=TARGETS, **extra)
    try:
        slack.outage("5xx")
        for n in range(5):
            assert (await a.webhook(incident_body(n))).status_code == 202
        await a.bot.tasks.drain()
        slack.recover()
        for h in (a, b):
            h.wall.advance(600)
        await asyncio.gather(
            a.bot.flows.outbox.deliver_due(),
            b.bot.flows.outbox.deliver_due(),
            a.bot.flows.outbox.deliver_due(),
            b.bot.flows.outbox.deliver_due(),
        )
        for _ in range(3):
            await asyncio.gather(a.bot.flows.outbox.deliver_due(), b.bot.flows.outbox.deliver_due())
        assert len(roots(slack)) == 5
        assert set(per_thread(slack).values()) == {3}
        assert len(slack.of("files.completeUploadExternal")) == 5
        assert {i.state for i in outbox(a)} == {items.SENT}
    finally:
        await a.close()
        await b.close()


async def test_an_incident_posted_before_the_outbox_existed_gets_an_update_not_a_second_root(
    h: Harness, slack: FakeSlack
) -> None:
    """A store upgraded to migration 0004 holds incidents whose root message was posted with
    no outbox row: their resolution updates that message, never posts another."""
    assert (await h.webhook(incident_body(1))).status_code == 202
    await slack.until("chat.update")
    await h.bot.tasks.drain()
    with h.bot.db.transaction() as s:  # as the store was before the upgrade
        s.execute(OutboxItem.__table__.delete())
    resolved = incident_body(1).replace(b'"status": "firing"', b'"status": "resolved"')
    assert (await h.webhook(resolved)).json()["outcome"] == "resolved"
    await h.bot.tasks.drain()
    assert len(roots(slack)) == 1
    last = slack.of("chat.update")[-1]
    assert ":white_check_mark: Resolved:" in str(last.args["blocks"])
