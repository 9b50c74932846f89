"""The engine features that hold requests up (issue 44 item 5): speculative decoding's acceptance,
deferred requests, LoRA adapter slots and KV loads. The real engine's recorded pages
(tests/fixtures/vllm-0.32.0) carry each feature's metrics as vLLM 0.32 exposes them (names,
labels, HELP and TYPE lines as its loggers write them), through the real probe and the shipped
runbooks: supported on a bad window, ruled out on a healthy one, "cannot tell" on an engine
without the metric. The names themselves are checked against the installed vLLM's source."""

from __future__ import annotations

import importlib.util
import inspect
import logging
import warnings
from pathlib import Path

import pytest
from prometheus_client.utils import floatToGoString

from bot.diagnosis.causes import CauseVerdict, data_gaps, judge
from bot.diagnosis.probes.context import TargetRef
from bot.diagnosis.probes.engine_signals import (
    DEFERRED,
    KV_FETCH,
    KV_LOADING,
    LORA_INFO,
    LORA_LABELS,
    SIGNAL_METRICS,
    SPEC_ACCEPTED,
    SPEC_DRAFT_TOKENS,
    SPEC_DRAFTS,
    WAITING_BY_REASON,
    read_signals,
)
from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.fleet_merge import Member, merge_rounds
from bot.diagnosis.probes.sampling import SAMPLED_METRICS
from bot.diagnosis.probes.vllm_metrics import parse_page
from bot.diagnosis.runbooks.builtin import default_registry
from bot.diagnosis.runbooks.loader import load_file
from bot.diagnosis.runbooks.runner import RunbookRunner
from bot.kernel.config import Target
from tests.fakes.nvml import FakeNvml
from tests.test_bot_probes import PAGES, context, serve

REPO = Path(__file__).parent.parent
RUNBOOKS = REPO / "runbooks"
ENGINE = 'engine="0",model_name="tiny-llama"'
T0 = 1.7959649e9  # the recorded engine's clock (its _created samples), for LoRA's timestamps

# --- pages in vLLM 0.32's exposition ----------------------------------------------------------


def queue(base: str, *, running: float, capacity: float = 0.0, deferred: float = 0.0) -> str:
    """A recorded page with its queue gauges set: requests running, waiting for capacity and
    deferred (vLLM's total waiting is their sum)."""
    values = {
        f"vllm:num_requests_running{{{ENGINE}}}": running,
        f"vllm:num_requests_waiting{{{ENGINE}}}": capacity + deferred,
        f'vllm:num_requests_waiting_by_reason{{{ENGINE},reason="capacity"}}': capacity,
        f'vllm:num_requests_waiting_by_reason{{{ENGINE},reason="deferred"}}': deferred,
    }
    lines = []
    for line in base.splitlines():
        head = line.rsplit(" ", 1)[0]
        lines.append(f"{head} {values[head]:.1f}" if head in values else line)
    return "\n".join(lines) + "\n"


def spec_decode(drafts: float, draft_tokens: float, accepted: float) -> str:
    """``SpecDecodingProm``'s counters (vllm/v1/spec_decode/metrics.py), as vLLM exposes a
    counter: ``_total`` and a ``_created`` gauge."""
    out = []
    for name, doc, value in (
        ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", drafts),
        ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", draft_tokens),
        ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", accepted),
    ):
        out += [
            f"# HELP {name}_total {doc}", f"# TYPE {name}_total counter",
            f"{name}_total{{{ENGINE}}} {value:.1f}",
            f"# HELP {name}_created {doc}", f"# TYPE {name}_created gauge",
            f"{name}_created{{{ENGINE}}} {floatToGoString(T0)}",
        ]  # fmt: skip
    return "\n".join(out) + "\n"


def kv_fetch(waiting_to_start: float, in_progress: float, completed_waiting: float) -> str:
    """``vllm:num_requests_kv_fetch_by_stage`` (vllm/v1/metrics/loggers.py, a KV consumer)."""
    name = KV_FETCH[0]
    stages = (("waiting_to_start", waiting_to_start), ("in_progress", in_progress),
              ("completed_waiting", completed_waiting))  # fmt: skip
    return (
        "\n".join(
            [
                f"# HELP {name} Number of waiting requests by async KV load stage.",
                f"# TYPE {name} gauge",
                *(f'{name}{{{ENGINE},stage="{s}"}} {v:.1f}' for s, v in stages),
            ]
        )
        + "\n"
    )


def lora(max_lora: int, states: list[tuple[str, str, float]]) -> str:
    """``vllm:lora_requests_info`` (vllm/v1/metrics/loggers.py): one gauge per state the engine
    was in, labelled (max_lora, waiting, running adapters), valued when vLLM last saw it."""
    name = LORA_INFO[0]
    lines = [f"# HELP {name} Running stats on lora requests.", f"# TYPE {name} gauge"]
    for waiting, running, seconds in states:
        lines.append(
            f'{name}{{max_lora="{max_lora}",waiting_lora_adapters="{waiting}",'
            f'running_lora_adapters="{running}"}} {floatToGoString(T0 + seconds)}'
        )
    return "\n".join(lines) + "\n"


def window(
    during: str = "", after: str = "", before: str = "", *, queues: tuple[str, str] | None = None
) -> list[str]:
    """The recorded before / during / after pages with feature families added to each (and,
    with ``queues``, the during and after pages replaced by those queue-set pages)."""
    middle, last = queues or (PAGES[1], PAGES[2])
    return [PAGES[0] + before, middle + during, last + after]


async def judged(pages: list[str], runbook: str = "vllm-latency.yaml") -> dict[str, CauseVerdict]:
    """A shipped runbook's probes on ``pages`` (the last repeating), judged, by cause."""
    loaded = load_file(RUNBOOKS / runbook, default_registry())
    ctx, _ = context(serve({"engine/metrics": pages}), nvml=FakeNvml.no_driver(), hostname="h")
    target = TargetRef("prod-a", Target(vllm_url="http://engine:8000"))
    result = await RunbookRunner(registry=default_registry()).run(loaded, target=target, ctx=ctx)
    verdicts = judge(loaded.runbook, result.readings)
    return {v.cause: v for v in verdicts}


def signals(pages: list[str]) -> dict[str, float | None]:
    """The feature readings of pages 10 s apart, parsed as the sampler parses them."""
    parsed = [
        parse_page(text, url="fixture", at=10.0 * i, only=SAMPLED_METRICS)
        for i, text in enumerate(pages)
    ]
    return read_signals(parsed).numbers


# --- speculative decoding: acceptance collapse ------------------------------------------------

SPEC_START = spec_decode(1_000, 3_000, 2_100)


async def test_spec_decode_collapse_is_supported_when_drafts_are_rejected() -> None:
    pages = window(spec_decode(1_100, 3_300, 2_130), spec_decode(1_300, 3_900, 2_190), SPEC_START)
    values = signals(pages)
    assert values["spec_acceptance_rate"] == pytest.approx(90 / 900)
    assert values["spec_accepted_per_draft"] == pytest.approx(90 / 300)
    verdict = (await judged(pages))["spec_decode_collapse"]
    assert verdict.verdict == "supported", verdict
    assert verdict.number == "10.0 % of drafted tokens accepted"
    assert "accepted only 10.0 % of the drafted tokens (0.3 per draft)" in verdict.evidence


async def test_spec_decode_collapse_is_ruled_out_when_drafts_are_accepted() -> None:
    pages = window(spec_decode(1_100, 3_300, 2_310), spec_decode(1_300, 3_900, 2_730), SPEC_START)
    assert signals(pages)["spec_acceptance_rate"] == pytest.approx(630 / 900)
    assert (await judged(pages))["spec_decode_collapse"].verdict == "ruled_out"


async def test_without_speculative_decoding_it_cannot_tell_and_says_why() -> None:
    verdicts = await judged(window())  # the recorded engine drafts nothing
    verdict = verdicts["spec_decode_collapse"]
    assert verdict.verdict == "cannot_tell"
    assert verdict.missing == ("vllm_metrics.spec_acceptance_rate",)
    assert "speculative decoding is off (--speculative-config)" in verdict.evidence
    # nothing drafted in the window (the counters stand still): unknown too, never 0
    idle = window(SPEC_START, SPEC_START, SPEC_START)
    assert signals(idle)["spec_acceptance_rate"] is None
    # a feature the engine does not run is no data gap: only the GPU's (no driver here)
    assert data_gaps(verdicts.values()) == [
        "no GPU snapshot: configure `ruleloop agent` on the GPU nodes"
    ]


# --- deferred requests ----------------------------------------------------------------------


async def test_deferred_waiting_is_supported_when_requests_sit_deferred() -> None:
    pages = window(queues=(queue(PAGES[1], running=2, deferred=6),
                           queue(PAGES[2], running=2, capacity=1, deferred=5)))  # fmt: skip
    values = signals(pages)
    assert values["deferred_share"] == pytest.approx(11 / 16)  # 11 of 16 request-scrapes
    assert values["waiting_deferred"] == 6.0
    verdict = (await judged(pages))["deferred_waiting"]
    assert verdict.verdict == "supported", verdict
    assert "deferred by a transient constraint (up to 6 at once)" in verdict.evidence


async def test_deferred_waiting_is_ruled_out_when_nothing_is_deferred() -> None:
    pages = window(queues=(queue(PAGES[1], running=4, capacity=3),
                           queue(PAGES[2], running=4, capacity=2)))  # fmt: skip
    assert signals(pages)["deferred_share"] == 0.0
    assert (await judged(pages))["deferred_waiting"].verdict == "ruled_out"
    # the recorded engine's own window: nothing deferred either
    assert (await judged(window()))["deferred_waiting"].verdict == "ruled_out"


async def test_without_the_waiting_by_reason_gauge_deferred_waiting_cannot_tell() -> None:
    name = WAITING_BY_REASON[0]
    older = [
        "\n".join(line for line in page.splitlines() if name not in line) + "\n"
        for page in window()
    ]
    assert signals(older)["deferred_share"] is None
    assert signals(older)["waiting_deferred"] is None
    verdict = (await judged(older))["deferred_waiting"]
    assert verdict.verdict == "cannot_tell"
    assert verdict.missing == ("vllm_metrics.deferred_share",)


# --- KV loads: transfer and offload stalls ----------------------------------------------------


async def test_kv_transfer_stall_is_supported_when_requests_wait_for_their_kv() -> None:
    pages = window(kv_fetch(2, 3, 0), kv_fetch(1, 4, 1), kv_fetch(0, 0, 0),
                   queues=(queue(PAGES[1], running=2, deferred=5),
                           queue(PAGES[2], running=3, deferred=6)))  # fmt: skip
    values = signals(pages)
    assert values["kv_fetch_share"] == pytest.approx(10 / 16)  # completed_waiting not counted
    assert values["kv_fetch_waiting"] == 5.0
    verdicts = await judged(pages)
    assert verdicts["kv_transfer_stall"].verdict == "supported", verdicts["kv_transfer_stall"]
    assert "up to 5 at once" in verdicts["kv_transfer_stall"].evidence
    supported = [c for c, v in verdicts.items() if v.verdict == "supported"]
    # a KV load defers its request too: the specific cause comes first
    assert supported.index("kv_transfer_stall") < supported.index("deferred_waiting")


async def test_kv_transfer_stall_is_ruled_out_when_loads_keep_up() -> None:
    pages = window(kv_fetch(0, 0, 1), kv_fetch(0, 0, 0), kv_fetch(0, 0, 0),
                   queues=(queue(PAGES[1], running=8, deferred=1),
                           queue(PAGES[2], running=8)))  # fmt: skip
    assert signals(pages)["kv_fetch_share"] == 0.0
    assert (await judged(pages))["kv_transfer_stall"].verdict == "ruled_out"


async def test_without_a_kv_connector_the_stall_cannot_tell() -> None:
    assert signals(window())["kv_fetch_share"] is None
    verdict = (await judged(window()))["kv_transfer_stall"]
    assert verdict.verdict == "cannot_tell" and verdict.missing == ("vllm_metrics.kv_fetch_share",)
    assert "no KV connector that loads KV" in verdict.evidence


# --- LoRA adapters: churn and slots -----------------------------------------------------------

LORA_START = lora(2, [("", "", 0.0), ("chat", "chat", 1.0)])


async def test_lora_churn_is_supported_when_adapters_wait_for_a_slot() -> None:
    # during the window: sql and chat fill both slots while summarize waits, then summarize runs
    during = lora(2, [("", "", 0.0), ("chat", "chat", 1.0), ("sql,summarize", "chat,sql", 12.0)])
    after = lora(2, [("", "", 0.0), ("chat", "chat", 1.0), ("sql,summarize", "chat,sql", 14.0),
                     ("", "summarize,sql", 19.0)])  # fmt: skip
    pages = window(during, after, LORA_START)
    values = signals(pages)
    assert values["lora_waiting_adapters"] == 1.0  # summarize
    assert values["lora_adapter_swaps"] == 1.0  # chat, sql, summarize on 2 slots
    verdict = (await judged(pages))["lora_adapter_churn"]
    assert verdict.verdict == "supported", verdict
    assert verdict.number == "1 adapters waiting for a LoRA slot"


async def test_lora_churn_is_ruled_out_when_adapters_fit_their_slots() -> None:
    during = lora(2, [("", "", 0.0), ("chat", "chat", 12.0)])
    after = lora(2, [("", "", 0.0), ("chat", "chat", 19.0), ("", "chat,sql", 15.0)])
    pages = window(during, after, LORA_START)
    assert signals(pages)["lora_waiting_adapters"] == 0.0
    assert signals(pages)["lora_adapter_swaps"] == 0.0
    assert (await judged(pages))["lora_adapter_churn"].verdict == "ruled_out"


async def test_lora_swaps_without_waiting_are_in_between() -> None:
    """Adapters that ran one after another on one slot swapped, but no request waited for one:
    neither condition decides."""
    after = lora(1, [("", "chat", 0.0), ("", "sql", 15.0), ("", "summarize", 19.0)])
    pages = window(after, after, lora(1, [("", "chat", 0.0)]))
    assert signals(pages)["lora_adapter_swaps"] == 2.0
    verdict = (await judged(pages))["lora_adapter_churn"]
    assert verdict.verdict == "cannot_tell" and verdict.evidence.startswith("in between")


async def test_without_lora_the_churn_cannot_tell() -> None:
    values = signals(window())
    assert values["lora_waiting_adapters"] is None and values["lora_adapter_swaps"] is None
    verdict = (await judged(window()))["lora_adapter_churn"]
    assert verdict.verdict == "cannot_tell"
    assert "LoRA is off (--enable-lora)" in verdict.evidence


def test_a_fleets_lora_states_are_read_per_replica() -> None:
    """Two replicas each running one adapter on one slot: no swap, though the fleet ran two."""
    a = [lora(1, [("", "chat", 0.0)]), lora(1, [("", "chat", 12.0)])]
    b = [lora(1, [("", "sql", 0.0)]), lora(1, [("", "sql", 12.0)])]
    members = [
        Member(
            {"replica": name}, {i: Exposition.parse(t, at=10.0 * i) for i, t in enumerate(pages)}
        )
        for name, pages in (("10.0.0.1:8000", a), ("10.0.0.2:8000", b))
    ]
    merged = merge_rounds(members, [0.0, 10.0])
    assert read_signals(merged).numbers["lora_adapter_swaps"] == 0.0
    assert read_signals(merged).numbers["lora_waiting_adapters"] == 0.0


# --- the shipped runbooks and the sampler -----------------------------------------------------

FEATURES = ("spec_decode_collapse", "kv_transfer_stall", "lora_adapter_churn", "deferred_waiting")


def test_every_shipped_runbook_judges_the_features_alike() -> None:
    hypotheses = []
    for path in sorted(RUNBOOKS.glob("*.yaml")):
        runbook = load_file(path, default_registry()).runbook
        hypotheses.append([h for h in runbook.hypotheses if h.cause in FEATURES])
        assert [h.cause for h in hypotheses[-1]] == list(FEATURES), path.name
    assert all(h == hypotheses[0] for h in hypotheses)
    assert SIGNAL_METRICS <= SAMPLED_METRICS  # the sampler keeps what the readings need


# --- the names, against the installed vLLM ----------------------------------------------------

# Each metric (as vLLM registers it: a counter without `_total`), and the label names and values
# read, with the file of vLLM 0.32 that defines them.
DEFINED = {
    "v1/spec_decode/metrics.py": [
        *(n.removesuffix("_total") for n in (*SPEC_DRAFTS, *SPEC_DRAFT_TOKENS, *SPEC_ACCEPTED)),
    ],
    "v1/metrics/loggers.py": [
        WAITING_BY_REASON[0], "reason", DEFERRED, KV_FETCH[0], "stage", LORA_INFO[0],
        *LORA_LABELS,
    ],
    "v1/metrics/stats.py": list(KV_LOADING),
}  # fmt: skip


def _vllm_root() -> Path:
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed in this Python (the engine extra: .[engine])")
    return Path(next(iter(spec.submodule_search_locations)))


def test_the_names_read_are_the_installed_vllms() -> None:
    """A rename in a later vLLM fails here, not silently as "cannot tell" in production."""
    root = _vllm_root()
    for path, names in DEFINED.items():
        source = (root / path).read_text()
        assert [n for n in names if f'"{n}"' not in source] == [], path


@pytest.mark.slow
def test_the_installed_vllms_metric_modules_define_the_names() -> None:
    """The metric-definition modules imported (vLLM imports torch: seconds), their constants and
    source against what the readings read."""
    _vllm_root()
    vllm_log = logging.getLogger("vllm")
    level = vllm_log.level
    vllm_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from vllm.v1.metrics import loggers, stats  # type: ignore[import-not-found,unused-ignore]
            from vllm.v1.spec_decode import metrics  # type: ignore[import-not-found,unused-ignore]
    finally:
        vllm_log.setLevel(level)
    assert loggers.WAITING_REASON_DEFERRED == DEFERRED
    assert set(KV_LOADING) <= set(stats.KV_FETCH_STAGES)
    for module, path in (
        (metrics, "v1/spec_decode/metrics.py"),
        (loggers, "v1/metrics/loggers.py"),
    ):
        source = inspect.getsource(module)
        missing = [n for n in DEFINED[path] if f'"{n}"' not in source]
        assert missing == [], path
