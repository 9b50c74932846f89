"""The statistical judge and the guardrails on a real engine, through /apply-adr: a change that
does nothing is not kept under '0.5x before' (two runs' maxima could pass it; the U test cannot),
and a change that makes an ungated number worse (TTFT, by serving one sequence at a time to four
streams; its gate is on goodput only) is said on the card with "warn" and rolled back with
"block".

The conditions are built, not borrowed from this machine's speed: the do-nothing change leaves
every speed flag as it was; one sequence at a time makes each stream's first token wait for the
streams ahead of it, hundreds of decode steps against one, whatever a step takes here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.engine.process import EngineManager
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import FakeSlack
from tests.test_remediation_engine import adr_text, approve, engine_flags, finished, own_engine

pytestmark = [pytest.mark.engine, pytest.mark.slow]
LAUNCH = ["--enforce-eager", "--max-num-seqs", "16"]
NOOP = "ADR-20261205-21"  # more KV blocks than the canary can use: no speed changes
SERIAL = "ADR-20261205-22"  # one sequence at a time: each stream's TTFT waits its turn
# Short prompts, long answers: serving one at a time, a stream's first token waits for about
# 3 x 128 decode steps of the streams ahead of it; serving 16, for one step of its own. The ratio
# is in steps, so it holds on any machine (at 16 answer tokens and 128-token prompts, a loaded
# box's prefill noise hid it: 84 -> 94 ms).
CANARY = {"concurrency": 4, "num_requests": 12, "prompt_length": 16, "output_length": 128}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineManager, int]]:
    yield from own_engine(tmp_path_factory, "judge-engine", LAUNCH)


def make_harness(
    tmp_path: Path, slack: FakeSlack, manager: EngineManager, port: int, guardrails: str
) -> Harness:
    target: dict[str, Any] = {
        "vllm_url": f"http://127.0.0.1:{port}",
        "actuator": {"kind": "local", "flags": LAUNCH, "state_dir": str(manager.state_dir),
                     "start_timeout_s": 600},
        # baseline: the before-run the guardrails compare with (SERIAL's gate needs none)
        "canary": CANARY | {"guardrails": guardrails, "baseline": True},
    }  # fmt: skip
    h = harness(tmp_path, slack=slack, targets={"local": target})
    adr_dir = tmp_path / "adr"
    for adr_id, change, gates in (
        (NOOP, {"num-gpu-blocks-override": 600}, "  max_tpot_p99_ms: 0.5x before\n"),
        # gated on goodput only, which serving one at a time keeps: TTFT and TPOT are watched
        (SERIAL, {"max-num-seqs": 1}, "  min_goodput_ratio: 0.5\n"),
    ):
        (adr_dir / f"{adr_id}-t.md").write_text(adr_text(adr_id, change, gates))
    return h


def card_shown(slack: FakeSlack) -> str:
    last = slack.of("chat.update")[-1].args
    return str(last["text"]) + json.dumps(last["blocks"], ensure_ascii=False)


async def test_a_change_that_does_nothing_is_not_kept_under_half_before(
    tmp_path: Path, slack: FakeSlack, engine: tuple[EngineManager, int]
) -> None:
    manager, port = engine
    h = make_harness(tmp_path, slack, manager, port, guardrails="warn")
    try:
        before = engine_flags(manager, port)
        rem = await finished(h, (await approve(h, slack, NOOP)).id)
        assert rem.state == "rolled_back", rem.result
        assert engine_flags(manager, port) == before
        (failure,) = rem.result["failures"]
        assert failure.startswith("TPOT p99 ") and (
            "(missed at 99%" in failure or "(not decided at 99%" in failure
        ), failure
        (sure,) = rem.result["how_sure"]
        assert sure.startswith("TPOT p99: ") and ", 12 before)" in sure, sure
        assert "How sure:* TPOT p99: " in card_shown(slack)
    finally:
        await h.close()


async def test_a_ttft_the_change_made_worse_blocks_it_with_block(
    tmp_path: Path, slack: FakeSlack, engine: tuple[EngineManager, int]
) -> None:
    manager, port = engine
    h = make_harness(tmp_path, slack, manager, port, guardrails="block")
    try:
        before = engine_flags(manager, port)
        rem = await finished(h, (await approve(h, slack, SERIAL)).id)
        assert rem.state == "rolled_back", rem.result
        assert engine_flags(manager, port) == before
        assert rem.result["failures"] == []  # its gate was met: the guardrail blocked it
        assert rem.result["reason"].startswith("a guardrail blocked it: TTFT p99 "), rem.result
        worse_lines = [w for w in rem.result["watched"] if w.startswith("TTFT p99 ")]
        assert len(worse_lines) == 1, rem.result
        (worse,) = worse_lines
        assert "worse beyond 20% and noise (above 1.2x before at 99%: p=" in worse
        assert "n=12, 12 before" in worse
        assert "Watched, not gated:* TTFT p99 " in card_shown(slack)
    finally:
        await h.close()


async def test_a_ttft_the_change_made_worse_is_said_when_kept_with_warn(
    tmp_path: Path, slack: FakeSlack, engine: tuple[EngineManager, int]
) -> None:
    """Last in the module: the change is kept, and the engine serves one sequence after it."""
    manager, port = engine
    h = make_harness(tmp_path, slack, manager, port, guardrails="warn")
    try:
        rem = await finished(h, (await approve(h, slack, SERIAL)).id)
        assert rem.state == "promoted", rem.result
        assert engine_flags(manager, port)["max-num-seqs"] == 1
        assert rem.result["how_sure"] == []  # no per-request gate: goodput is a whole-run ratio
        worse = [w for w in rem.result["watched"] if w.startswith("TTFT p99 ")]
        assert len(worse) == 1 and "worse beyond 20% and noise" in worse[0], rem.result
        shown = card_shown(slack)
        assert "kept: the canary met every gate; but worse beyond noise, ungated: TTFT p99" in (
            shown
        )
    finally:
        await h.close()
