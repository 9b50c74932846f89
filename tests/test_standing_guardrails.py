"""The target's standing gates as guardrails of a change (bot/canary/guardrails.py ``standing``,
bot/remediation/run.py ``standing_gates``): the accepted ADRs in force on a target (here the
seed's ADR-20260831-01, TTFT p99 <= 350 ms, listed under ``[scheduler.targets.prod-a]``) judge the
canary of every other change there, with the same judge as a gate. A change that meets its own
gate (goodput) but takes TTFT to 450 ms is rolled back with ``block`` and kept but said with
``warn``; with no ADR in force, or when the change's ADR supersedes the one in force, nothing
stands over it.

The bot is the real one; the canary gate and the actuator are the seams its constructor takes,
here a canary that returns per-request latencies without an engine (the guardrails on a real
engine are in test_judge_engine.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bot.adr.models import AdrGates
from bot.canary.verdict import gates_from, judged
from bot.kernel.config import CanarySpec
from bot.kernel.store.models import Remediation
from bot.remediation.gate import GateRun
from tests.canary_reports import report_of
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import FakeSlack
from tests.fakes.sse_engine import SseEngine
from tests.test_adr_relative_flow import MemoryActuator

SEED = "ADR-20260831-01"  # gates: TTFT p99 <= 350 ms, TPOT p99 <= 35 ms, goodput >= 95 %
ADR = "ADR-20261205-31"
SLOW_TTFT_ADR = f"""---
id: {ADR}
title: Fewer sequences at once
status: accepted
date: 2026-12-05
deciders:
- inference-platform-oncall
supersedes: []
fix:
  engine_args:
    max-num-seqs: 4
gates:
  min_goodput_ratio: 0.9
---

# {ADR}: Fewer sequences at once

## 1. 变更上下文 (Context)

Fewer sequences at once.

## 2. 实验对比数据 (Metrics Matrix)

| 配置参数 | TTFT (P99) | TPOT (P99) | Goodput | 显存碎片率 | 结论 |
| :--- | :--- | :--- | :--- | :--- | :--- |
| max-num-seqs=4 | - | - | 99% | - | 生产推荐配置 |

## 3. 固化的系统规则 (Solidified Rules)

- Serve four sequences at once.
"""


class SlowTtftCanary:
    """Every canary run: 40 requests with TTFT around 450 ms and TPOT around 10 ms, judged by
    the gates it is given (the change's own: goodput, which it meets)."""

    def __init__(self) -> None:
        self.runs = 0

    async def __call__(
        self, base_url: str, spec: CanarySpec, gates: AdrGates, *, shape: object = None,
        **judging: object,
    ) -> GateRun:  # fmt: skip
        self.runs += 1
        rng = np.random.default_rng(self.runs)
        ttft = [float(v) for v in 450.0 * rng.lognormal(0.0, 0.1, size=40)]
        return judged(report_of(ttft, [10.0] * 40), gates_from(gates))


@pytest.fixture
async def engine() -> AsyncIterator[SseEngine]:
    """What a rollback's check that the engine serves again asks (one short completion)."""
    async with SseEngine() as served:
        yield served


def make(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine, *, guardrails: str, in_force: list[str]
) -> Harness:
    h = harness(
        tmp_path, slack=slack, bot_options={"gate": SlowTtftCanary(), "actuator_for": MemoryActuator},
        targets={"prod-a": {"vllm_url": engine.base_url, "actuator": {"kind": "dry-run"},
                            "canary": {"guardrails": guardrails}}},
        scheduler={"targets": {"prod-a": {"adrs": in_force}}},
    )  # fmt: skip
    (tmp_path / "adr" / f"{ADR}-fewer-sequences.md").write_text(SLOW_TTFT_ADR)
    return h


async def applied(h: Harness, adr_id: str = ADR) -> Remediation:
    await h.bot.remediation.request(user_id="U1", adr_id=adr_id, target="prod-a")
    return await h.approve_change()


def last_card(slack: FakeSlack) -> str:
    last = slack.of("chat.update")[-1].args
    return str(last["text"]) + json.dumps(last["blocks"], ensure_ascii=False)


STANDING = f"TTFT p99 {{}} against the standing gate ≤ 350ms ({SEED}): missed (p99 in ["


@pytest.mark.parametrize("guardrails", ["block", "warn"])
async def test_a_change_over_the_targets_standing_ttft_gate(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine, guardrails: str
) -> None:
    h = make(tmp_path, slack, engine, guardrails=guardrails, in_force=[SEED])
    try:
        done = await applied(h)
        lines: list[Any] = done.result["watched"]
        (line,) = [w for w in lines if "standing gate" in w]
        assert "against the standing gate ≤ 350ms (ADR-20260831-01): missed (p99 in [" in line
        assert "(n=40)" in line, line
        if guardrails == "block":
            assert done.state == "rolled_back", done.result
            assert done.result["failures"] == []  # its own gate was met
            assert done.result["reason"].startswith("a guardrail blocked it: TTFT p99 ")
        else:
            assert done.state == "promoted", done.result
            assert "kept: the canary met every gate; but worse beyond noise, ungated: TTFT p99" in (
                last_card(slack)
            )
        assert "Watched, not gated:* TTFT p99 " in last_card(slack)
    finally:
        await h.close()


@pytest.mark.parametrize("why", ["no ADR in force", "the change supersedes it"])
async def test_nothing_stands_over_a_change_without_an_adr_in_force_or_one_it_supersedes(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine, why: str
) -> None:
    h = make(tmp_path, slack, engine, guardrails="block", in_force=[] if why == "no ADR in force" else [SEED])
    if why == "the change supersedes it":
        superseding = SLOW_TTFT_ADR.replace("supersedes: []", f"supersedes:\n- {SEED}")
        (tmp_path / "adr" / f"{ADR}-fewer-sequences.md").write_text(superseding)
    try:
        done = await applied(h)
        assert done.state == "promoted", done.result
        assert not any("standing gate" in w for w in done.result["watched"] + done.result["held"])
    finally:
        await h.close()


async def test_an_adrs_own_guardrails_overrule_the_targets(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine
) -> None:
    """The target warns; the ADR says `guardrails: block` in its front matter: rolled back."""
    h = make(tmp_path, slack, engine, guardrails="warn", in_force=[SEED])
    strict = SLOW_TTFT_ADR.replace("gates:\n", "guardrails: block\ngates:\n", 1)
    (tmp_path / "adr" / f"{ADR}-fewer-sequences.md").write_text(strict)
    try:
        done = await applied(h)
        assert done.state == "rolled_back", done.result
        assert done.result["reason"].startswith("a guardrail blocked it: TTFT p99 ")
    finally:
        await h.close()
