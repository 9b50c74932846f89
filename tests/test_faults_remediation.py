"""Faults of the approval flow (docs/reliability.md): nobody approves their own change unless the
team opted out, and a button that expires while it is being checked approves nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fakes.bot import Harness, harness
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
    await h.bot.flows.tasks.drain()
    (rem,) = remediations(h)
    assert (rem.state, rem.approved_by) == ("dry_run", ["U2"])


async def test_self_approval_is_an_explicit_opt_out(tmp_path: Path, slack: FakeSlack) -> None:
    h = harness(tmp_path, slack=slack, remediation={"allow_self_approval": True})
    try:
        tokens = await request(h, slack, user="U1")
        card = slack.of("chat.postMessage")[-1]
        assert "two-person rule" not in str(card.args["blocks"])
        await h.click(tokens["remediation_approve"], user="U1", action_id="remediation_approve")
        await h.bot.flows.tasks.drain()
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

