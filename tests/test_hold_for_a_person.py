"""A canary that could not decide, where the ADR says ``gates: {inconclusive: hold}``: the change
stays on the canary stage, held, and its card asks a person to keep it or roll it back.

A real bot (tests/fakes/bot.py: real store, real slack-bolt app, Slack faked at the wire); the
canary gate is the seam the bot takes, answering with a real report of eight requests judged by
the real judge: a TTFT p99 of eight requests is their maximum, so a p99 gate is "not decided"
(a p99 needs 528). Keep goes on to the rollout; Roll back, the hold's expiry and a missed gate
roll back; resume leaves a held change be; a second change on the target is refused meanwhile.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.adr import AdrGates
from bot.canary.verdict import gates_from, judged
from bot.kernel import CanarySpec, UsageError
from bot.kernel.store import Remediation
from bot.remediation import GateRun
from tests import store_reads
from tests.canary_reports import report_of
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import FakeSlack
from tests.fakes.sse_engine import SseEngine
from tests.test_adr_relative_flow import MemoryActuator
from tests.test_standing_guardrails import ADR, SLOW_TTFT_ADR

HOLD_ADR = SLOW_TTFT_ADR.replace(
    "gates:\n  min_goodput_ratio: 0.9\n",
    "gates:\n  max_ttft_p99_ms: {limit}\n  inconclusive: {inconclusive}\n",
)
TTL_S = 1800.0  # [remediation] hold_ttl_s, by default


async def eight_requests(
    base_url: str, spec: CanarySpec, gates: AdrGates, *, shape: object = None, **judging: object
) -> GateRun:
    """The canary: eight requests of 40 ms TTFT, judged by the ADR's gates."""
    return judged(report_of([40.0] * 8, [10.0] * 8), gates_from(gates))


def make(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine, *, limit: float = 1000,
    inconclusive: str = "hold",
) -> Harness:  # fmt: skip
    spec: dict[str, Any] = {"vllm_url": engine.base_url, "actuator": {"kind": "dry-run"}}
    h = harness(
        tmp_path, slack=slack, transport=httpx.MockTransport(lambda r: httpx.Response(404)),
        bot_options={"gate": eight_requests, "actuator_for": MemoryActuator},
        targets={"prod-a": spec},
    )  # fmt: skip
    text = HOLD_ADR.format(limit=limit, inconclusive=inconclusive)
    (tmp_path / "adr" / f"{ADR}-fewer-sequences.md").write_text(text)
    return h


@pytest.fixture
async def engine():  # noqa: ANN201
    async with SseEngine() as served:
        yield served


@pytest.fixture
async def held(tmp_path: Path, slack: FakeSlack, engine: SseEngine):  # noqa: ANN201
    h = make(tmp_path, slack, engine)
    await h.bot.remediation.request(user_id="U1", adr_id=ADR, target="prod-a")
    rem = await h.approve_change()
    yield h, rem
    await h.close()


def actions(h: Harness, rem_id: int) -> list[str]:
    with h.bot.db.transaction() as s:
        return [e.action for e in store_reads.audit_trail(s) if e.action.startswith("remediation.")]


async def decide(
    h: Harness, rem: Remediation, kind: str, user: str, tokens: dict[str, str] | None = None
) -> Remediation:
    tokens = tokens or await h.bot.remediation.records.tokens(f"remediation:{rem.id}")
    await h.bot.remediation.click(user_id=user, token=tokens[kind])
    await h.bot.tasks.drain()
    return await h.bot.remediation.records.get(rem.id)


def last_card(slack: FakeSlack) -> str:
    return str(slack.of("chat.update")[-1].args["blocks"])


async def test_an_undecided_canary_is_held_on_its_card_and_holds_the_target(
    held: tuple[Harness, Remediation], slack: FakeSlack
) -> None:
    h, rem = held
    assert rem.state == "held", rem.result
    assert "remediation.held" in actions(h, rem.id)
    assert rem.result["undecided"] and "not decided at 99%" in rem.result["undecided"][0]
    card = last_card(slack)
    assert "Keep the change" in card and "Roll back" in card and "remediation_keep" in card
    assert "held for a person: the canary could not decide TTFT p99" in card
    assert "rolled back at 02:30 UTC unless someone keeps it" in card  # the fake clock, + 30 min
    with pytest.raises(UsageError, match="held for a person to keep or roll back"):
        await h.bot.remediation.request(user_id="U1", adr_id=ADR, target="prod-a")
    # a resume after a restart leaves it be: nothing runs it, and it must not be rolled back
    assert await h.bot.remediation.resume(stale_s=0) == 0
    assert (await h.bot.remediation.records.get(rem.id)).state == "held"


async def test_a_person_keeps_it_and_it_is_rolled_out_saying_who_and_how_sure(
    held: tuple[Harness, Remediation], slack: FakeSlack
) -> None:
    h, rem = held
    tokens = await h.bot.remediation.records.tokens(f"remediation:{rem.id}")
    with pytest.raises(UsageError, match="second person"):  # the requester: two-person rule
        await decide(h, rem, "keep", "U1")
    done = await decide(h, rem, "keep", "U2")
    assert done.state == "promoted", done.result
    assert done.result["kept_by"] == "<@U2>"
    assert "kept: <@U2> kept it, the canary undecided (TTFT p99" in last_card(slack)
    trail = actions(h, rem.id)
    assert trail[trail.index("remediation.held"):] == [
        "remediation.held", "remediation.hold_kept", "remediation.canary_passed",
        "remediation.promoted",
    ], trail  # fmt: skip
    with pytest.raises(UsageError, match="promoted"):
        await decide(h, rem, "roll_back", "U1", tokens)  # spent with the other


async def test_the_requester_rolls_it_back(
    held: tuple[Harness, Remediation], slack: FakeSlack
) -> None:
    h, rem = held
    done = await decide(h, rem, "roll_back", "U1")
    assert done.state == "rolled_back", done.result
    assert done.result["reason"] == "rolled back by <@U1>: the canary could not decide"


async def test_a_hold_nobody_answers_is_rolled_back_when_it_expires(
    held: tuple[Harness, Remediation], slack: FakeSlack
) -> None:
    h, rem = held
    h.wall.advance(TTL_S - 60)
    assert await h.bot.remediation.expire_due() == 0  # not yet
    h.wall.advance(61)
    assert await h.bot.remediation.expire_due() == 1
    await h.bot.tasks.drain()
    done = await h.bot.remediation.records.get(rem.id)
    assert done.state == "rolled_back"
    assert done.result["reason"].startswith("held 30 minutes with the canary undecided")
    assert "remediation.hold_expired" in actions(h, rem.id)
    with pytest.raises(UsageError, match="This hold ended at 02:30 UTC"):
        await decide(h, rem, "keep", "U2")


async def test_keep_and_roll_back_at_once_one_wins(
    held: tuple[Harness, Remediation], slack: FakeSlack
) -> None:
    h, rem = held
    tokens = await h.bot.remediation.records.tokens(f"remediation:{rem.id}")
    clicks = await asyncio.gather(
        h.bot.remediation.click(user_id="U2", token=tokens["keep"]),
        h.bot.remediation.click(user_id="U1", token=tokens["roll_back"]),
        return_exceptions=True,
    )
    await h.bot.tasks.drain()
    lost = [c for c in clicks if isinstance(c, UsageError)]
    assert len(lost) == 1, clicks
    assert "first" in str(lost[0]) or "already" in str(lost[0]), clicks
    done = await h.bot.remediation.records.get(rem.id)
    assert done.state in ("promoted", "rolled_back")
    assert sum(a in ("remediation.hold_kept", "remediation.hold_rolled_back")
               for a in actions(h, rem.id)) == 1  # fmt: skip


@pytest.mark.parametrize(
    ("limit", "inconclusive", "why"),
    [(1000, "rollback", "not decided"), (1, "hold", "missed")],
    ids=["rollback-by-default-or-asked", "a-missed-gate-is-never-held"],
)
async def test_otherwise_the_change_is_rolled_back(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine, limit: float, inconclusive: str,
    why: str,
) -> None:  # fmt: skip
    h = make(tmp_path, slack, engine, limit=limit, inconclusive=inconclusive)
    try:
        await h.bot.remediation.request(user_id="U1", adr_id=ADR, target="prod-a")
        done = await h.approve_change()
    finally:
        await h.close()
    assert done.state == "rolled_back", done.result
    assert (
        done.result["reason"].startswith("canary failed the gates: ")
        and why in (done.result["reason"])
    )
