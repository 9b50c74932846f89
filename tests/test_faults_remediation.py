"""Faults of the approval flow (docs/reliability.md): nobody approves their own change unless the
team opted out, and a button that expires while it is being checked approves nothing."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import select

from bot.kernel.errors import UsageError
from bot.kernel.store import service as store
from bot.kernel.store.db import Database
from bot.kernel.store.models import ActionToken, Remediation
from bot.remediation.records import ChangeRequest, RemediationRecords
from tests import store_reads
from tests.fakes.bot import Harness, harness
from tests.fakes.clock import WallClock
from tests.fakes.slack_api import FakeSlack
from tests.test_remediation_slack import ADR, answers, remediations, request

pytestmark = pytest.mark.faults


@pytest.fixture
async def h(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[Harness]:
    harness_ = harness(tmp_path, slack=slack)
    yield harness_
    await harness_.close()


async def test_by_default_the_requester_cannot_approve_their_own_change(
    h: Harness, slack: FakeSlack
) -> None:
    """Item 7: with no two-person setting, U1 requested and approved its own change."""
    tokens = await request(h, slack, user="U1")
    await h.click(tokens["remediation_approve"], user="U1", action_id="remediation_approve")
    (text,) = await answers(slack, 1)
    assert text.startswith(f"{ADR} needs a second person: the requester cannot approve it")
    assert remediations(h)[0].state == "pending"
    await h.click(tokens["remediation_approve"], user="U2", action_id="remediation_approve")
    await h.bot.tasks.drain()
    (rem,) = remediations(h)
    assert (rem.state, rem.approved_by) == ("dry_run", ["U2"])


async def test_self_approval_is_an_explicit_opt_out(tmp_path: Path, slack: FakeSlack) -> None:
    h = harness(tmp_path, slack=slack, remediation={"allow_self_approval": True})
    try:
        tokens = await request(h, slack, user="U1")
        card = slack.of("chat.postMessage")[-1]
        assert "two-person rule" not in str(card.args["blocks"])
        await h.click(tokens["remediation_approve"], user="U1", action_id="remediation_approve")
        await h.bot.tasks.drain()
        (rem,) = remediations(h)
        assert (rem.state, rem.approved_by) == ("dry_run", ["U1"])
    finally:
        await h.close()


async def test_the_opt_out_does_not_override_a_two_person_target(
    tmp_path: Path, slack: FakeSlack
) -> None:
    target = {"vllm_url": "http://10.0.0.5:8000", "actuator": {"kind": "dry-run"}}
    h = harness(
        tmp_path, slack=slack, remediation={"allow_self_approval": True},
        targets={"prod-a": {**target, "two_person": True}},
    )  # fmt: skip
    try:
        tokens = await request(h, slack, user="U1")
        await h.click(tokens["remediation_approve"], user="U1", action_id="remediation_approve")
        (text,) = await answers(slack, 1)
        assert "needs a second person" in text and remediations(h)[0].state == "pending"
    finally:
        await h.close()


async def test_a_button_that_expired_after_its_check_claims_nothing(tmp_path: Path) -> None:
    """Item 17: the claim's UPDATE did not look at the expiry, which was checked earlier, with
    a Slack call in between; a button that expired meanwhile still approved the change."""
    db = Database(f"sqlite:///{tmp_path / 'ruleloop.db'}")
    db.create_schema()
    wall = WallClock()
    records = RemediationRecords(db=db, clock=wall.now)
    try:
        with db.transaction() as s:
            incident = store.create(
                s, key="g", source="slash", title="t", target="prod-a", labels={}, at=wall.now()
            )
            incident_id = incident.id
        rem, tokens = await records.create(
            ChangeRequest(
                incident_id=incident_id, channel_id=None, adr_id=ADR, target="prod-a",
                user_id="U1", two_person=True, change={"block-size": 32}, before={},
                after_flags={}, gateway_rules=None, ttl_s=60,
            )
        )  # fmt: skip
        wall.advance(61)  # the button expired between the service's check and the claim
        with pytest.raises(UsageError, match=r"^This button expired at 02:01 UTC"):
            await records.claim(
                token=tokens["approve"], user_id="U2", remediation_id=rem.id, to_state="approved",
                action="remediation.approved", detail={},
            )  # fmt: skip
        with db.transaction() as s:
            assert s.get(Remediation, rem.id).state == "pending"  # type: ignore[union-attr]
            assert all(t.used_at is None for t in s.scalars(select(ActionToken)))
            assert [e.action for e in store_reads.audit_trail(s)] == ["remediation.requested"]
        wall.at -= dt.timedelta(seconds=2)  # still valid: the same claim goes through
        assert await records.claim(
            token=tokens["approve"], user_id="U2", remediation_id=rem.id, to_state="approved",
            action="remediation.approved", detail={},
        )  # fmt: skip
    finally:
        db.dispose()
