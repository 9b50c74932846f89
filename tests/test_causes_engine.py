"""The causes' confusion matrix on real vLLM engines (issue 33): each cause induced, then diagnosed.

Each induction loads a real engine (tests/causes_inductions.py) while the bot's diagnosis runs
on it the way production runs it: the shipped runbooks (their window sized from this engine's
measured speed), the real probes scraping the engine's /metrics, the Diagnoser's verdicts. The
induced cause must be the one cause supported; the healthy run supports none.

Two engines, one at a time: one whose scheduler step may take 8,192 tokens (long prompts
prefilled whole) with four sequence slots, for the healthy run, step mixing, queueing and
abandoned work; one with a KV cache of 4 blocks, for preemption. docs/causes.md has the table.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest

from bot.adr.store import AdrStore
from bot.diagnosis.models import Diagnosis
from bot.diagnosis.probes.context import ProbeContext, TargetRef
from bot.diagnosis.runbooks.builtin import default_registry
from bot.diagnosis.runbooks.loader import load_dir
from bot.diagnosis.runbooks.runner import RunbookRunner
from bot.diagnosis.service import Diagnoser
from bot.engine.process import EngineInfo, EngineManager, free_port
from bot.kernel.config import Target
from tests import causes_inductions as ind
from tests.conftest import TEST_FLAGS

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.usefixtures("box_alone")]

ROOT = Path(__file__).parent.parent
ALERT = {"alertname": "VLLMTimeToFirstTokenP99High"}  # the shipped TTFT alert's runbook
SEQS = 4
STEP_BUDGET = 8192
STEPS_ENGINE = ("--max-num-batched-tokens", str(STEP_BUDGET), "--max-num-seqs", str(SEQS))
# 5 blocks of 128 tokens (one kept aside by vLLM): 512 tokens, one request's max_model_len
SMALL_KV_ENGINE = ("--num-gpu-blocks-override", "5", "--max-model-len", "512",
                   "--max-num-seqs", str(SEQS))  # fmt: skip

Planner = Callable[[ind.Measured], ind.Plan]
# name -> (the cause it induces, None for healthy; the engine's flags; its plan); in run order,
# the steps engine's first (the engine changes once)
INDUCTIONS: dict[str, tuple[str | None, tuple[str, ...], Planner]] = {
    "healthy": (None, STEPS_ENGINE, ind.healthy),
    "mixing": ("prefill_decode_mixing", STEPS_ENGINE, ind.mixing),
    "queueing": ("queueing", STEPS_ENGINE, lambda m: ind.queueing(m, SEQS)),
    "abandoned": ("abandoned_work", STEPS_ENGINE, ind.abandoned),
    "kv_pressure": ("kv_cache_pressure", SMALL_KV_ENGINE, lambda m: ind.kv_pressure(m, SEQS)),
}


class OneEngine:
    """At most one engine at a time (the box is shared): other flags stop the current one.
    What an engine was measured to do is kept while it runs."""

    def __init__(self, manager: EngineManager) -> None:
        self.manager = manager
        self.info: EngineInfo | None = None
        self.flags: tuple[str, ...] | None = None
        self.measured: ind.Measured | None = None

    def get(self, flags: tuple[str, ...]) -> EngineInfo:
        if self.info is None or self.flags != flags:
            self.stop()
            self.info = self.manager.start(
                port=free_port(), flags=[*TEST_FLAGS, *flags], timeout_s=600
            )
            self.flags = flags
        return self.info

    def stop(self) -> None:
        if self.info is not None:
            self.manager.stop(self.info.port)
        self.info = self.flags = self.measured = None


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OneEngine]:
    one = OneEngine(EngineManager(state_dir=tmp_path_factory.mktemp("causes")))
    try:
        yield one
    finally:
        one.stop()


def runbooks_with_window(target: Path, window_s: float) -> Path:
    """The shipped runbooks, their engine sampling window ``window_s`` (a tenth of it between
    scrapes) instead of 10 s every 1 s."""
    target.mkdir()
    for path in (ROOT / "runbooks").glob("*.yaml"):
        text, n = re.subn(
            r"\{window_s: 10, interval_s: 1\}",
            f"{{window_s: {window_s:.2f}, interval_s: {window_s / 10:.3f}}}",
            path.read_text(),
        )
        assert n > 0, (
            f"{path.name} no longer samples the engine with {{window_s: 10, interval_s: 1}}"
        )
        (target / path.name).write_text(text)
    return target


async def diagnose(info: EngineInfo, runbooks: Path) -> Diagnosis:
    """The production diagnosis of the TTFT alert on the engine: runbooks, probes, verdicts."""
    registry = default_registry()
    async with httpx.AsyncClient(timeout=60) as http:
        diagnoser = Diagnoser(
            runbooks=load_dir(runbooks, registry),
            runner=RunbookRunner(registry=registry),
            adrs=AdrStore(root=ROOT / "adr"),
            context=lambda: ProbeContext(http=http),
            clock=lambda: dt.datetime.now(dt.UTC),
        )
        target = TargetRef("tiny", Target(vllm_url=info.base_url))
        return await diagnoser.diagnose(target, labels=ALERT)


def verdicts(diagnosis: Diagnosis) -> dict[str, str]:
    """cause -> verdict, read from the summary's JSON (what the thread, page and store show)."""
    return {c.cause: c.verdict for c in diagnosis.summary().causes}


READINGS = (
    "vllm_metrics.max_step_tokens", "vllm_metrics.queue_ttft_share",
    "vllm_metrics.waiting_capacity", "vllm_metrics.preemptions_per_s",
    "vllm_metrics.kv_cache_usage", "queue_cancel.wasted_prefill_share",
    "vllm_metrics.goodput_ratio", "vllm_metrics.aborted_share", "vllm_metrics.requests_running",
)  # fmt: skip


@pytest.mark.parametrize("name", list(INDUCTIONS))
async def test_the_induced_cause_is_the_one_supported(
    name: str, engines: OneEngine, tmp_path: Path
) -> None:
    cause, flags, plan_for = INDUCTIONS[name]
    info = engines.get(flags)
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session,
        httpx.AsyncClient(timeout=60) as http,
    ):
        client = ind.Client(info, session, http)
        if engines.measured is None:
            engines.measured = await ind.measure(
                client, step_budget=STEP_BUDGET, long=flags == STEPS_ENGINE
            )
        plan = plan_for(engines.measured)
        runbooks = runbooks_with_window(tmp_path / "runbooks", plan.window_s)
        diagnosis, sent = await client.under(plan.streams, lambda: diagnose(info, runbooks))
    judged = verdicts(diagnosis)
    supported = {c for c, v in judged.items() if v == "supported"}
    shown = {r: diagnosis.readings.value(r) for r in READINGS}
    print(f"\n{name}: {engines.measured}, window {plan.window_s:.1f} s, {sent} requests sent;"
          f"\nverdicts {judged}\nreadings {shown}")  # fmt: skip
    assert supported == ({cause} if cause else set()), (judged, shown)
    if cause is not None:
        assert judged[cause] == "supported"
