"""/apply-adr's live stage (bot/remediation/live_stage.py) in a real bot: after the canary met
the gates, each step judges the canary replica against the two baseline replicas on production
traffic (their /metrics pages scripted at the wire, one more interval of traffic per scrape,
tests/test_canary_live.py's fleet) with the live judge. A canary as fast as the baseline is
promoted after every step; a slower one is rolled back at its first step; a canary whose traffic
is too thin to judge is rolled back once the steps it could not judge pass the limit: promoted
only on evidence.

The canary gate and the actuator are the seams the bot takes (a gate that passes, flags held in
memory); the rollback's check that the engine serves asks a real local SSE server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from sqlalchemy import select

from bot.adr import AdrGates
from bot.canary.live import Decision, LiveVerdict
from bot.canary.verdict import gates_from, judged
from bot.kernel import CanarySpec, Target
from bot.kernel.store import Remediation
from bot.remediation import GateRun, LiveJudge
from tests import store_reads
from tests.canary_reports import report_of
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import FakeSlack
from tests.fakes.sse_engine import SseEngine
from tests.test_adr_relative_flow import MemoryActuator
from tests.test_canary_live import (
    BASELINE,
    CANARY,
    FAST_TPOT,
    FAST_TTFT,
    SLOW_TPOT,
    SLOW_TTFT,
    Fleet,
)
from tests.test_standing_guardrails import ADR, SLOW_TTFT_ADR

Traffic = tuple[Mapping[float, int], Mapping[float, int]]
THIN = ({0.02: 1}, {0.01: 1})  # one request an interval: under 50 in a window


async def passing_gate(
    base_url: str, spec: CanarySpec, gates: AdrGates, *, shape: object = None, **judging: object
) -> GateRun:
    """The canary before the live stage: meets its gates (goodput)."""
    return judged(report_of([40.0] * 8, [10.0] * 8), gates_from(gates))


@pytest.fixture
async def engine() -> AsyncIterator[SseEngine]:
    async with SseEngine() as served:
        yield served


def make(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine, *, canary: Traffic | None = None,
    judge: LiveJudge | None = None, steps: int = 2, **target: Any,
) -> Harness:  # fmt: skip
    """A bot whose target prod-a has a live stage of ``steps`` steps, judged on the replicas'
    pages with this ``canary`` traffic (or by ``judge``); ``target``: prod-a's settings
    changed, None to remove one."""
    fleet = Fleet({BASELINE[0]: (FAST_TTFT, FAST_TPOT), BASELINE[1]: (FAST_TTFT, FAST_TPOT),
                   CANARY: canary or (FAST_TTFT, FAST_TPOT)})  # fmt: skip
    spec: dict[str, Any] = {
        "vllm_url": engine.base_url, "replicas": list(BASELINE), "canary_replicas": [CANARY],
        "actuator": {"kind": "kubernetes", "namespace": "inference", "deployment": "vllm",
                     "canary_deployment": "vllm-canary", "canary_url": CANARY},
        "live_stage": {"steps": steps, "step_s": 60, "interval_s": 10},
    } | target  # fmt: skip
    options: dict[str, Any] = {"gate": passing_gate, "actuator_for": MemoryActuator}
    h = harness(
        tmp_path, slack=slack, transport=httpx.MockTransport(fleet.handler),
        bot_options=options | ({"live": judge} if judge is not None else {}),
        targets={"prod-a": {k: v for k, v in spec.items() if v is not None}},
    )  # fmt: skip
    (tmp_path / "adr" / f"{ADR}-fewer-sequences.md").write_text(SLOW_TTFT_ADR)
    return h


async def changed(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine, canary: Traffic
) -> Remediation:
    """Request and approve the ADR on prod-a with this canary traffic; the change as it ended."""
    h = make(tmp_path, slack, engine, canary=canary)
    try:
        await h.bot.remediation.request(user_id="U1", adr_id=ADR, target="prod-a")
        return await h.approve_change()
    finally:
        await h.close()


async def test_a_canary_as_fast_as_the_baseline_is_promoted_after_every_step(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine
) -> None:
    done = await changed(tmp_path, slack, engine, (FAST_TTFT, FAST_TPOT))
    assert done.state == "promoted", done.result
    assert [line.split(":")[0:2] for line in done.result["live"]] == [
        ["step 1/2", " keep"], ["step 2/2", " keep"],
    ]  # fmt: skip
    assert "*Live stage:* step 1/2: keep: " in str(slack.of("chat.update")[-1].args["blocks"])


async def test_a_slower_canary_is_rolled_back_at_its_first_step(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine
) -> None:
    done = await changed(tmp_path, slack, engine, (SLOW_TTFT, SLOW_TPOT))
    assert done.state == "rolled_back", done.result
    reason = done.result["reason"]
    assert reason.startswith("the live stage found the canary slower than the baseline in 1 "
                             "of 1 steps (allowed: 0): step 1/2: roll back: "), reason  # fmt: skip
    assert "(TTFT: canary p50 " in reason and len(done.result["live"]) == 1


async def test_a_canary_too_thin_to_judge_is_rolled_back_past_the_limit(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine
) -> None:
    done = await changed(tmp_path, slack, engine, THIN)
    assert done.state == "rolled_back", done.result
    reason = done.result["reason"]
    assert reason.startswith(
        "the live stage could not judge 2 of 2 steps (allowed: 1): step 2/2: cannot judge: "
    ), reason
    assert "under 50 observations" in reason


class Judge:
    """The live stage's judge, scripted: one decision per step; at a step it has none for, it
    waits for good (``held`` is then set): the bot is stopped in that step."""

    def __init__(self, *decisions: Decision) -> None:
        self.decisions = list(decisions)
        self.held = asyncio.Event()

    async def __call__(self, name: str, target: object, stage: object) -> LiveVerdict:
        if not self.decisions:
            self.held.set()
            await asyncio.Event().wait()
        return LiveVerdict(self.decisions.pop(0), "scripted")


async def stopped_in_step_2(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine, first: Decision
) -> int:
    """A bot that judged step 1 of 3 (``first``) and stopped in step 2, its tasks cancelled
    and its heartbeats over: the change's id, left in ``canary`` with one step on record."""
    judge = Judge(first)
    h = make(tmp_path, slack, engine, judge=judge, steps=3)
    await h.bot.remediation.request(user_id="U1", adr_id=ADR, target="prod-a")
    with h.bot.db.transaction() as s:
        (requested,) = s.scalars(select(Remediation)).all()
    tokens = await h.bot.remediation.records.tokens(f"remediation:{requested.id}")
    await h.bot.remediation.click(user_id="U2", token=tokens["approve"])
    await asyncio.wait_for(judge.held.wait(), timeout=60)
    await h.bot.tasks.drain(timeout_s=0)  # stopped: what runs is cancelled
    await h.close()
    with h.bot.db.transaction() as s:
        left = s.get(Remediation, requested.id)
    assert left is not None and left.state == "canary" and len(left.result["live"]) == 1
    return requested.id


@dataclass
class Resumed:
    """How a change taken over by a new bot ended: the row, its actions, the takeover's."""

    rem: Remediation
    actions: list[str]
    takeover: dict[str, Any]


async def resumed(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine, judge: Judge, *,
    first: Decision = "keep", **target: Any,
) -> Resumed:  # fmt: skip
    """A bot stopped in step 2 (step 1 said ``first``), then a new bot on the same store that
    finds the change silent, takes it over and ends it, judging with ``judge``."""
    rem_id = await stopped_in_step_2(tmp_path, slack, engine, first)
    h = make(tmp_path, slack, engine, judge=judge, steps=3, **target)
    try:
        assert await h.bot.remediation.resume(stale_s=0) == 1
        await h.bot.tasks.drain(timeout_s=60)
        with h.bot.db.transaction() as s:
            done = s.get(Remediation, rem_id)
            trail = [e for e in store_reads.audit_trail(s)
                     if e.detail.get("remediation") == rem_id]  # fmt: skip
    finally:
        await h.close()
    assert done is not None
    takeover = next(e.detail for e in trail if e.action == "remediation.resumed")
    return Resumed(done, [e.action.removeprefix("remediation.") for e in trail], takeover)


async def test_a_bot_stopped_between_live_steps_is_resumed_at_the_next_step_and_promotes(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine
) -> None:
    done = await resumed(tmp_path, slack, engine, Judge("keep", "keep"))
    assert done.rem.state == "promoted", done.rem.result
    assert [line.split(": ")[0:2] for line in done.rem.result["live"]] == [
        ["step 1/3", "keep"], ["step 2/3", "keep"], ["step 3/3", "keep"],
    ]  # fmt: skip
    assert done.takeover["found_in"] == "canary" and done.takeover["live_steps_judged"] == 1
    # one story: the dead run's steps, one takeover, then each step left once, then the end
    after = done.actions[done.actions.index("resumed") + 1 :]
    assert after == ["live_step", "live_step", "canary_passed", "promoted"], done.actions
    assert done.actions.count("resumed") == 1 and done.actions.count("live_step") == 4
    assert done.rem.result["numbers"] and done.rem.result["how_sure"] is not None  # kept
    notes = [str(c.args.get("blocks")) for c in slack.of("chat.update")]
    assert any("going on with step 2/3" in n for n in notes), notes


async def test_a_resumed_live_stage_counts_the_steps_judged_before_the_stop(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine
) -> None:
    """Step 1 said "cannot judge" before the stop, and the limit still counts it: one more
    after the restart (2, 1 allowed) rolls the change back."""
    done = await resumed(tmp_path, slack, engine, Judge("cannot judge"), first="cannot judge")
    assert done.rem.state == "rolled_back", done.rem.result
    reason = done.rem.result["reason"]
    assert reason.startswith("the live stage could not judge 2 of 2 steps (allowed: 1)"), reason


async def test_a_target_whose_live_stage_is_gone_rolls_the_change_back(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine
) -> None:
    """Nothing to go on with after the restart: the change left in ``canary`` is rolled back,
    as any change a stopped bot leaves is."""
    done = await resumed(tmp_path, slack, engine, Judge(), live_stage=None, canary_replicas=None)
    assert done.rem.state == "rolled_back", done.rem.result
    assert done.takeover["found_in"] == "canary" and "live_steps_judged" not in done.takeover
    assert done.actions[-2:] == ["rolling_back", "rolled_back"], done.actions


LOCAL = {"kind": "local", "canary_url": "http://127.0.0.1:8001"}
STAGE = {"steps": 2}


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ({"actuator": LOCAL}, "list the canary stage's pods in canary_replicas"),
        ({"canary_replicas": [CANARY]}, "or a second local engine (a local actuator's canary_url)"),
        ({"canary_replicas": ["http://127.0.0.1:8001"], "actuator": {"kind": "local"}},
         "needs a second engine for the canary stage: set [targets.NAME.actuator] canary_url"),
        ({"canary_replicas": ["http://127.0.0.1:8002"], "actuator": LOCAL},
         'canary_replicas must be ["http://127.0.0.1:8001"], the actuator\'s canary_url'),
        ({"canary_replicas": [CANARY], "actuator": {"kind": "kubernetes", "namespace": "inference",
                                                     "deployment": "vllm"}},
         "puts the change on the canary stage alone first"),
    ],
)  # fmt: skip
def test_a_live_stage_without_a_canary_beside_the_baseline_is_refused_saying_what_to_set(
    target: dict[str, Any], said: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        Target.model_validate({"vllm_url": "http://127.0.0.1:8000", "live_stage": STAGE} | target)
    assert said in str(caught.value)


def test_a_local_engine_with_a_canary_engine_beside_it_may_have_a_live_stage() -> None:
    target = Target.model_validate(
        {
            "vllm_url": "http://127.0.0.1:8000",
            "live_stage": STAGE,
            "actuator": LOCAL,
            "canary_replicas": ["http://127.0.0.1:8001/"],
        }  # fmt: skip
    )
    assert target.live_stage is not None and target.canary_replicas == ["http://127.0.0.1:8001"]
