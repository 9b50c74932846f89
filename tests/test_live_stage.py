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

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.adr import AdrGates
from bot.canary.verdict import gates_from, judged
from bot.kernel import CanarySpec
from bot.kernel.store import Remediation
from bot.remediation import GateRun
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


def make(tmp_path: Path, slack: FakeSlack, engine: SseEngine, canary: Traffic) -> Harness:
    fleet = Fleet({BASELINE[0]: (FAST_TTFT, FAST_TPOT), BASELINE[1]: (FAST_TTFT, FAST_TPOT),
                   CANARY: canary})  # fmt: skip
    target: dict[str, Any] = {
        "vllm_url": engine.base_url, "replicas": list(BASELINE), "canary_replicas": [CANARY],
        "actuator": {"kind": "kubernetes", "namespace": "inference", "deployment": "vllm",
                     "canary_deployment": "vllm-canary", "canary_url": CANARY},
        "live_stage": {"steps": 2, "step_s": 60, "interval_s": 10},
    }  # fmt: skip
    h = harness(
        tmp_path, slack=slack, transport=httpx.MockTransport(fleet.handler),
        bot_options={"gate": passing_gate, "actuator_for": MemoryActuator},
        targets={"prod-a": target},
    )  # fmt: skip
    (tmp_path / "adr" / f"{ADR}-fewer-sequences.md").write_text(SLOW_TTFT_ADR)
    return h


async def changed(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine, canary: Traffic
) -> Remediation:
    """Request and approve the ADR on prod-a with this canary traffic; the change as it ended."""
    h = make(tmp_path, slack, engine, canary)
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
