"""/apply-adr, its approval buttons and the ADR draft review, through signed Slack requests
against the fake Slack Web API. The target uses the dry-run actuator: these tests are about the
policy and the buttons (the real-engine apply and rollback are in test_remediation_engine.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from bot.adr.shared import SharedAdrStore
from bot.kernel.store.models import ActionToken, Remediation
from tests import store_reads
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import Call, FakeSlack

ADR = "ADR-20260831-01"


@pytest.fixture
async def h(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[Harness]:
    harness_ = harness(tmp_path, slack=slack)
    yield harness_
    await harness_.close()


def buttons(call: Call) -> dict[str, str]:
    """action_id -> value of the buttons in a posted or updated message."""
    return {
        element["action_id"]: element["value"]
        for block in call.args["blocks"]
        if block["type"] == "actions"
        for element in block["elements"]
    }


CARD_IS = f"{ADR} on prod-a: the confirmation card is in the incident"
DONE = (CARD_IS, "Drafted ADR-")  # the answers to requests that were carried out


async def answers(slack: FakeSlack, count: int) -> list[str]:
    """The ephemeral answers (response_url posts) so far, oldest first, but for the ones
    saying a request was carried out (where the card is, what was drafted)."""
    seen = count
    while True:
        texts = [c.args["text"] for c in await slack.until("response_url", seen)]
        refusals = [t for t in texts if not t.startswith(DONE)]
        if len(refusals) >= count:
            return refusals
        seen += 1


async def request(h: Harness, slack: FakeSlack, *, user: str = "U1") -> dict[str, str]:
    """/apply-adr, acked at once; the answer says where the card is; the card's buttons."""
    response = await h.slash(f"{ADR} prod-a", user=user, command="/apply-adr")
    assert (response.status_code, response.text) == (200, "")
    (answer, *_) = await slack.until("response_url")
    assert answer.args["text"].startswith(CARD_IS)
    root, card = await slack.until("chat.postMessage", 2)
    assert card.args["thread_ts"] == root.args.get("ts", card.args["thread_ts"])
    return buttons(card)


def remediations(h: Harness) -> list[Remediation]:
    with h.bot.db.transaction() as s:
        return list(s.scalars(select(Remediation)).all())


def actions(h: Harness) -> list[str]:
    with h.bot.db.transaction() as s:
        return [e.action for e in store_reads.audit_trail(s)]


async def test_apply_adr_shows_the_exact_diff_and_gates_then_applies_after_approval(
    h: Harness, slack: FakeSlack
) -> None:
    tokens = await request(h, slack)
    card = slack.of("chat.postMessage")[1]
    shown = json.dumps(card.args["blocks"], ensure_ascii=False)
    for line in (
        "--block-size: (unset) → 32",
        "--enable-chunked-prefill: (unset) → on",
        "--max-num-batched-tokens: (unset) → 2048",
        "TTFT p99 ≤ 350 ms",
        "TPOT p99 ≤ 35.0 ms",
        "goodput ≥ 95.0 %",
    ):
        assert line in shown
    assert set(tokens) == {"remediation_approve", "remediation_deny"}
    assert (
        await h.click(tokens["remediation_approve"], user="U2", action_id="remediation_approve")
    ).status_code == 200
    await h.bot.tasks.drain()
    (rem,) = remediations(h)
    assert (rem.state, rem.approved_by) == ("dry_run", ["U2"])
    last = slack.of("chat.update")[-1]
    assert last.args["ts"] == card.args.get("ts", last.args["ts"])
    assert last.args["text"] == f"{ADR} on prod-a: dry run: nothing was changed"
    assert buttons(last) == {}  # no buttons once decided
    assert [a for a in actions(h) if a.startswith("remediation.")] == [
        "remediation.requested", "remediation.approved", "remediation.dry_run",
    ]  # fmt: skip


async def test_a_proposed_adr_is_refused_and_nothing_changes(
    h: Harness, slack: FakeSlack, tmp_path: Path
) -> None:
    adr_dir = tmp_path / "adr"
    seed = next(adr_dir.glob(f"{ADR}-*.md"))
    proposed = (
        seed.read_text()
        .replace(ADR, "ADR-20261129-07")
        .replace("status: accepted", "status: proposed")
    )
    (adr_dir / "ADR-20261129-07-proposed.md").write_text(proposed)
    await h.slash("ADR-20261129-07 prod-a", command="/apply-adr")
    (text,) = await answers(slack, 1)
    assert text.startswith("ADR-20261129-07 is proposed, not accepted: only accepted ADRs")
    assert text.endswith("Nothing was changed.")
    assert slack.of("chat.postMessage") == [] and remediations(h) == []


async def test_an_unauthorised_user_is_refused(h: Harness, slack: FakeSlack) -> None:
    await h.slash(f"{ADR} prod-a", user="U9", command="/apply-adr")
    (text,) = await answers(slack, 1)
    assert text == "You may not request ADR changes. Allowed: <@U1>. Nothing was changed."
    assert slack.of("chat.postMessage") == [] and remediations(h) == []


async def test_an_approver_not_on_the_list_is_refused(h: Harness, slack: FakeSlack) -> None:
    tokens = await request(h, slack)
    await h.click(tokens["remediation_approve"], user="U7", action_id="remediation_approve")
    (text,) = await answers(slack, 1)
    assert text.startswith("You may not approve changes. Approvers: <@U1>, <@U2>.")
    assert remediations(h)[0].state == "pending"


async def test_two_person_rule_refuses_self_approval_then_takes_another_approver(
    tmp_path: Path, slack: FakeSlack
) -> None:
    target = {
        "vllm_url": "http://10.0.0.5:8000",
        "actuator": {"kind": "dry-run"},
        "two_person": True,
    }
    h = harness(tmp_path, slack=slack, targets={"prod-a": target})
    try:
        tokens = await request(h, slack)
        await h.click(tokens["remediation_approve"], user="U1", action_id="remediation_approve")
        (text,) = await answers(slack, 1)
        assert text.startswith(f"{ADR} needs a second person: the requester cannot approve it")
        (rem,) = remediations(h)
        assert rem.state == "pending" and rem.approvals_needed == 2
        with h.bot.db.transaction() as s:  # the refused click did not use the button up
            assert all(t.used_at is None for t in s.scalars(select(ActionToken)))
        await h.click(tokens["remediation_approve"], user="U2", action_id="remediation_approve")
        await h.bot.tasks.drain()
        assert remediations(h)[0].state == "dry_run"
    finally:
        await h.close()


async def test_a_used_button_is_refused_the_second_time(h: Harness, slack: FakeSlack) -> None:
    tokens = await request(h, slack)
    await h.click(tokens["remediation_approve"], user="U2", action_id="remediation_approve")
    await h.bot.tasks.drain()
    updates = len(slack.of("chat.update"))
    await h.click(tokens["remediation_approve"], user="U2", action_id="remediation_approve")
    await h.click(tokens["remediation_deny"], user="U1", action_id="remediation_deny")
    first, second = await answers(slack, 2)
    assert first.startswith("This button was already used by <@U2> at ")
    assert "is now dry_run" in first and first.endswith("Nothing was changed.")
    assert second.startswith("This button was already used by <@U2>")
    await h.bot.tasks.drain()
    assert len(slack.of("chat.update")) == updates  # the card did not change
    assert actions(h).count("remediation.approved") == 1


async def test_an_expired_button_is_refused_and_the_sweep_marks_it(
    h: Harness, slack: FakeSlack
) -> None:
    tokens = await request(h, slack)
    h.wall.advance(15 * 60 + 1)
    await h.click(tokens["remediation_approve"], user="U2", action_id="remediation_approve")
    (text,) = await answers(slack, 1)
    assert text.startswith("This button expired at 02:15 UTC (approval buttons last 15 minutes)")
    assert text.endswith(f"ask again with `/apply-adr {ADR} prod-a`.")
    assert remediations(h)[0].state == "pending"
    assert await h.bot.remediation.expire_due() == 1
    assert await h.bot.remediation.expire_due() == 0  # once
    assert remediations(h)[0].state == "expired"
    assert (
        slack.of("chat.update")[-1].args["text"] == f"{ADR} on prod-a: expired, nothing was changed"
    )


async def test_cancel_by_the_requester(h: Harness, slack: FakeSlack) -> None:
    tokens = await request(h, slack)
    await h.click(tokens["remediation_deny"], user="U1", action_id="remediation_deny")
    await h.bot.tasks.drain()
    assert remediations(h)[0].state == "cancelled"
    assert actions(h)[-1] == "remediation.cancelled"


async def test_bad_usage_says_how(h: Harness, slack: FakeSlack) -> None:
    await h.slash("", command="/apply-adr")
    await h.slash("ADR-20990101-01 prod-a", command="/apply-adr")
    await h.slash(f"{ADR} prod-z", command="/apply-adr")
    # each is answered when its own work ends (reading the ADR store takes its own time)
    usage, unknown_adr, unknown_target = sorted(await answers(slack, 3))  # U < n < u
    assert usage.startswith("Usage: /apply-adr ADR-ID [target]")
    assert unknown_adr.startswith("no ADR ADR-20990101-01 (known: ") and ADR in unknown_adr
    assert unknown_target == "unknown target 'prod-z'; known targets: prod-a"


async def test_adr_draft_is_posted_and_reviewed_by_someone_else(
    h: Harness, slack: FakeSlack, tmp_path: Path
) -> None:
    await h.slash("prod-a")  # a diagnosis: the draft's baseline row and gates
    await slack.until("chat.update")
    await h.bot.tasks.drain()
    response = await h.slash("", command="/adr-draft")
    assert (response.status_code, response.text) == (200, "")  # acked; the draft follows
    (drafted,) = await slack.until("response_url")
    assert drafted.args["text"].startswith("Drafted ADR-20261129-01")
    await h.bot.tasks.drain()
    summary = slack.of("chat.postMessage")[-1]
    upload = slack.of("upload")[-1]  # the chart came first
    assert upload.body.startswith(b"---\nid: ADR-20261129-01\n")
    review = buttons(summary)
    await h.click(review["adr_draft_accept"], user="U1", action_id="adr_draft_accept")
    (text,) = await answers(slack, 1)
    assert text.startswith("You may not review ADR drafts. Allowed: <@U2>.")
    await h.click(review["adr_draft_accept"], user="U2", action_id="adr_draft_accept")
    await h.bot.tasks.drain()
    adrs = SharedAdrStore(root=tmp_path / "adr", db=h.bot.db, sync=False)
    assert "ADR-20261129-01" in [a.id for a in adrs.accepted()]  # in the store, for every replica
    assert not list((tmp_path / "adr").rglob("ADR-20261129-01*"))  # nothing written into adr/
    update: dict[str, Any] = slack.of("chat.update")[-1].args
    assert (
        "Accepted by <@U2>" in json.dumps(update["blocks"])
        and buttons(slack.of("chat.update")[-1]) == {}
    )
    assert actions(h)[-1] == "adr_draft.accepted"


async def test_user_groups_in_access_lists_stand_for_their_members(
    tmp_path: Path, slack: FakeSlack
) -> None:
    slack.usergroups["S0ONCALL1"] = ["U5"]
    access = {"diagnose": ["U1"], "apply": ["S0ONCALL1"], "approve": ["S0LEADS99"], "review": []}
    h = harness(tmp_path, slack=slack, access=access)
    try:
        tokens = await request(h, slack, user="U5")  # a member of the on-call group
        await h.slash(f"{ADR} prod-a", user="U1", command="/apply-adr")  # not a member
        await h.click(tokens["remediation_approve"], user="U2", action_id="remediation_approve")
        # both answers are deferred past the ack: they may arrive in either order
        refusals = sorted(await answers(slack, 2))
        assert refusals[0].startswith(
            "You may not approve changes. Approvers: <!subteam^S0LEADS99>."
        ), refusals  # a group Slack will not list grants nothing (fail closed)
        assert refusals[1].startswith(
            "You may not request ADR changes. Allowed: <!subteam^S0ONCALL1>."
        ), refusals
        asked = [c.args["usergroup"] for c in slack.calls if c.method == "usergroups.users.list"]
        assert asked[0] == "S0ONCALL1" and set(asked) == {"S0ONCALL1", "S0LEADS99"}
        assert asked.count("S0ONCALL1") == 1  # members are kept for a few minutes
        assert remediations(h)[0].state == "pending"
    finally:
        await h.close()
