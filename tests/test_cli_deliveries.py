"""`ruleloop db deliveries --resend ID` / `--failed` (issue 22, item 13): a message Slack refused
for good is made due again by a person once the cause is fixed, and the running bot sends it.

The real bot (create_bot) on real SQLite, the fake Slack at the wire refusing a channel; the
command line runs against the same store, as an operator would beside the running bot.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import select

from bot.app.cli import cli
from bot.kernel.store.models import OutboxItem
from tests import store_reads
from tests.fakes.alerts import alert, body
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import FakeSlack

ENV = {"RULELOOP_CONFIG": "", "RULELOOP_DATABASE_URL": ""}


def deliveries(tmp_path: Path, *args: str) -> Result:
    return CliRunner().invoke(
        cli, ["db", "deliveries", "--state-dir", str(tmp_path / "state"), *args], env=ENV
    )


def messages(h: Harness) -> list[OutboxItem]:
    with h.bot.db.transaction() as s:
        query = select(OutboxItem).where(OutboxItem.kind != "diagnose").order_by(OutboxItem.id)
        return list(s.scalars(query).all())


async def tick(h: Harness, *, after_s: float) -> dict[str, Any]:
    """One period of the outbox job on the bot's wall clock."""
    assert h.bot.scheduler is not None
    h.wall.advance(after_s)
    job = next(j for j in h.bot.scheduler.jobs if j.name == "outbox")
    (result,) = await h.bot.scheduler.runner.tick(job)
    await h.bot.tasks.drain()
    return dict(result.detail)


@pytest.fixture
async def refused(tmp_path: Path, slack: FakeSlack) -> Any:
    """A bot whose channel Slack does not know: the incident's messages all end failed."""
    slack.missing.add("#gone")
    h = harness(tmp_path, slack=slack, matching_adr=True, slack_extra={"channel": "#gone"})
    assert (await h.webhook(body(alert(ruleloop_target="prod-a")))).status_code == 202
    await h.bot.tasks.drain()
    assert {m.state for m in messages(h)} == {"failed"}
    yield h
    await h.close()


async def test_resend_of_a_refused_root_sends_it_and_its_thread_once_the_channel_exists(
    refused: Harness, slack: FakeSlack, tmp_path: Path
) -> None:
    """Before: the failed messages could only be listed; nothing but an Alertmanager repeat
    tried them again (a resolved incident gets none)."""
    h = refused
    for _ in range(3):  # the outbox job leaves failed messages alone
        await tick(h, after_s=60)
    tried = [c for c in slack.calls if c.method == "chat.postMessage"]
    assert [c.status for c in tried] == [400] and slack.of("chat.postMessage") == []
    root, *rest = messages(h)
    listed = deliveries(tmp_path)
    assert listed.exit_code == 0, listed.output
    assert f"[{root.id}] incident 1 root (failed" in listed.output
    assert "--resend ID" in listed.output
    slack.missing.discard("#gone")  # the channel is created (the reason's fix)
    resent = deliveries(tmp_path, "--resend", str(root.id))
    assert resent.exit_code == 0, resent.output
    assert f"{1 + len(rest)} message(s) due again" in resent.output
    done = await tick(h, after_s=15)
    assert done["sent"] == 1 + len(rest) and (done["pending"], done["failed"]) == (0, 0)
    assert {m.state for m in messages(h)} == {"sent"}
    posted = slack.of("chat.postMessage")
    assert sum(1 for c in posted if not c.args.get("thread_ts")) == 1  # the root, once
    assert sum(1 for c in posted if c.args.get("thread_ts")) >= 2  # findings, matching ADRs
    with h.bot.db.transaction() as s:
        actions = Counter(e.action for e in store_reads.audit_trail(s))
    assert actions["slack.delivery_resent"] == 1 + len(rest)


async def test_resend_failed_makes_every_failed_message_due(
    refused: Harness, slack: FakeSlack, tmp_path: Path
) -> None:
    slack.missing.discard("#gone")
    failed = len(messages(refused))
    resent = deliveries(tmp_path, "--failed")
    assert resent.exit_code == 0, resent.output
    assert f"{failed} message(s) due again" in resent.output
    await tick(refused, after_s=15)
    assert {m.state for m in messages(refused)} == {"sent"}
    again = deliveries(tmp_path, "--failed")  # nothing left to resend
    assert again.exit_code == 0 and "0 message(s) due again" in again.output


async def test_resend_refuses_unknown_and_undelivered_ids_with_exit_2(
    refused: Harness, slack: FakeSlack, tmp_path: Path
) -> None:
    unknown = deliveries(tmp_path, "--resend", "9999")
    assert unknown.exit_code == 2, unknown.output
    assert "no Slack message 9999 in the store" in unknown.output
    assert "Traceback" not in unknown.output and "unexpected" not in unknown.output
    slack.missing.discard("#gone")
    root = messages(refused)[0]
    assert deliveries(tmp_path, "--resend", str(root.id)).exit_code == 0
    await tick(refused, after_s=15)
    sent = deliveries(tmp_path, "--resend", str(root.id))
    assert sent.exit_code == 2 and f"message {root.id} (incident 1 root) is already" in sent.output
    both = deliveries(tmp_path, "--resend", str(root.id), "--failed")
    assert both.exit_code == 2 and "not both" in both.output


async def test_resend_of_an_id_no_store_holds_is_a_usage_error(
    refused: Harness, tmp_path: Path
) -> None:
    # 2^64 and more overflowed the database driver: "unexpected failure" with an error id
    for number in ("99999999999999999999", "0", "-3"):
        result = deliveries(tmp_path, "--resend", number)
        assert result.exit_code == 2, result.output
        assert "Invalid value for '--resend'" in result.output and "1<=x<=" in result.output
        assert "unexpected" not in result.output and "Traceback" not in result.output
