"""Causes, not symptoms: the condition parser, the three-valued verdicts (bounds, spans, missing
readings), the engine's step readings on pages a real engine served, and the shipped runbooks."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import pytest

from bot.diagnosis import cause_text
from bot.diagnosis.causes import (
    NOT_JUDGED,
    CauseVerdict,
    data_gaps,
    judge,
    judge_one,
    one_replica,
)
from bot.diagnosis.probes.context import TargetRef
from bot.diagnosis.probes.engine_steps import STEP_METRICS, decode_bound, read_steps
from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.fleet_merge import Member, merge_rounds
from bot.diagnosis.probes.sampling import SAMPLED_METRICS, SampledWindow
from bot.diagnosis.probes.vllm_metrics import parse_page
from bot.diagnosis.probes.vllm_window import aborted_share
from bot.diagnosis.replicas import judge as judge_fleet
from bot.diagnosis.runbooks.builtin import default_registry
from bot.diagnosis.runbooks.conditions import parse
from bot.diagnosis.runbooks.loader import load_file
from bot.diagnosis.runbooks.models import Hypothesis, Runbook
from bot.diagnosis.runbooks.runner import RunbookRunner
from bot.kernel.config import Target
from bot.kernel.numbers.reading import Bound, Measured
from tests.fakes.nvml import FakeNvml

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-0.32.0"
REPO = Path(__file__).parent.parent


def pages(drop: str | None = None) -> list[Exposition]:
    """The real engine's before / during / after pages (tests/fixtures/README.md), 10 s apart;
    ``drop``: a metric family removed, as an engine that lacks it would serve them."""
    out = []
    for name, at in (("before", 0.0), ("during", 0.3), ("after", 10.0)):
        text = (FIXTURES / f"{name}.prom").read_text()
        if drop is not None:
            text = "\n".join(line for line in text.splitlines() if drop not in line) + "\n"
        out.append(parse_page(text, url="fixture", at=at, only=SAMPLED_METRICS))
    return out


# --- the parser -------------------------------------------------------------------------------


def test_and_binds_tighter_than_or() -> None:
    cond = parse("a.x > 1 or a.y > 1 and a.z > 1")
    assert [[c.reading for c in g] for g in cond.alternatives] == [["a.x"], ["a.y", "a.z"]]
    assert cond.readings == ["a.x", "a.y", "a.z"]
    values = Measured.of({"a.x": 0.0, "a.y": 2.0, "a.z": 0.0})
    assert cond.holds(values.reading) is False  # (x) or (y and z): neither holds
    assert parse("a.x > 1 or a.y > 1").holds(values.reading) is True


@pytest.mark.parametrize(
    "text",
    ["a.x >> 1", "a.x > 1 and", "and a.x > 1", "a.x > 1 AND a.y > 1", "x > 1", "a.x > one",
     "(a.x > 1)", "a.x > 1 xor a.y > 2", ""],
)  # fmt: skip
def test_parser_refuses_what_is_not_a_clause(text: str) -> None:
    with pytest.raises(ValueError, match="is not a clause: write `probe.reading OP number`"):
        parse(text)


def test_three_valued_and_or_with_missing_readings() -> None:
    read = Measured.of({"a.x": 5.0, "a.y": None}).reading
    assert parse("a.x > 1 and a.y > 1").holds(read) is None  # true and unknown
    assert parse("a.x > 9 and a.y > 1").holds(read) is False  # false and unknown
    assert parse("a.x > 1 or a.y > 1").holds(read) is True  # true or unknown
    assert parse("a.x > 9 or a.y > 1").holds(read) is None  # false or unknown


def test_bounds_and_spans_decide_only_where_they_decide() -> None:
    spanned = Measured.of({"a.steps": 8192.0}, spans={"a.steps": (4097.0, 8192.0)}).reading
    assert parse("a.steps > 4096").holds(spanned) is True
    assert parse("a.steps <= 2048").holds(spanned) is False
    assert parse("a.steps > 6000").holds(spanned) is None  # inside the bucket: undecided
    first_bucket = Measured.of({"a.steps": 1.0}, bounds={"a.steps": Bound.AT_MOST}).reading
    assert parse("a.steps <= 2048").holds(first_bucket) is True
    beyond = Measured.of({"a.steps": 16384.0}, bounds={"a.steps": Bound.MORE_THAN}).reading
    assert parse("a.steps > 4096").holds(beyond) is True
    assert parse("a.steps < 20000").holds(beyond) is None


# --- verdicts ---------------------------------------------------------------------------------

MIXING = Hypothesis(
    cause="prefill_decode_mixing",
    supported_when="e.steps > 4096 and e.running > 1",
    ruled_out_when="e.steps <= 2048",
    number="{e.steps} tokens in one step",
    evidence="steps reached {e.steps} tokens beside {e.running} decoding",
)


@pytest.mark.parametrize(
    ("values", "spans", "verdict", "missing"),
    [
        ({"e.steps": 8192.0, "e.running": 4.0}, {"e.steps": (4097.0, 8192.0)}, "supported", ()),
        ({"e.steps": 512.0, "e.running": 4.0}, {"e.steps": (257.0, 512.0)}, "ruled_out", ()),
        ({"e.steps": 8192.0, "e.running": 1.0}, {"e.steps": (4097.0, 8192.0)}, "cannot_tell", ()),
        ({"e.steps": 4096.0, "e.running": 4.0}, {"e.steps": (2049.0, 4096.0)}, "cannot_tell", ()),
        ({"e.steps": None, "e.running": 4.0}, {}, "cannot_tell", ("e.steps",)),
        ({"e.steps": 8192.0, "e.running": None}, {}, "cannot_tell", ("e.running",)),
    ],
)
def test_a_hypothesis_is_supported_ruled_out_or_cannot_tell(
    values: dict[str, float | None],
    spans: dict[str, tuple[float, float]],
    verdict: str,
    missing: tuple[str, ...],
) -> None:
    judged = judge_one(MIXING, "mixing", Measured.of(values, spans=spans))
    assert judged.verdict == verdict
    assert judged.missing == missing
    if verdict == "supported":
        assert judged.evidence == "steps reached 4,097–8,192 tokens beside 4 decoding"
        assert judged.number == "4,097–8,192 tokens in one step"
    if verdict == "ruled_out":
        assert judged.number == "257–512 tokens in one step"
    if missing:
        assert judged.number is None and f"not measured: {missing[0]}" in judged.evidence
    elif verdict == "cannot_tell":
        assert judged.evidence.startswith("in between: ")


def test_without_ruled_out_when_a_false_condition_rules_out_and_overlap_cannot_tell() -> None:
    plain = Hypothesis(cause="queueing", supported_when="e.q > 0.5", number="{e.q}", evidence="")
    assert judge_one(plain, "q", Measured.of({"e.q": 0.1})).verdict == "ruled_out"
    assert judge_one(plain, "q", Measured.of({"e.q": None})).verdict == "cannot_tell"
    overlap = Hypothesis(
        cause="queueing", supported_when="e.q > 0.5", ruled_out_when="e.q > 0.4",
        number="{e.q}", evidence="",
    )  # fmt: skip
    both = judge_one(overlap, "q", Measured.of({"e.q": 0.9}))
    assert both.verdict == "cannot_tell" and "overlap" in both.evidence


def test_judge_orders_supported_first_and_says_why_the_rest_is_not_judged() -> None:
    runbook = Runbook(
        name="x",
        probes=[{"probe": "e"}],  # type: ignore[list-item]
        hypotheses=[
            Hypothesis(cause="queueing", supported_when="e.q > 0.5", number="{e.q}", evidence="q"),
            Hypothesis(
                cause="gpu_fault", supported_when="n.xid > 0", number="{n.xid}", evidence=""
            ),
            MIXING,
        ],
    )
    values = {"e.q": 0.1, "e.steps": 8192.0, "e.running": 3.0, "n.xid": None}
    verdicts = judge(runbook, Measured.of(values, spans={"e.steps": (4097.0, 8192.0)}))
    assert [(v.cause, v.verdict) for v in verdicts][:3] == [
        ("prefill_decode_mixing", "supported"),
        ("queueing", "ruled_out"),
        ("gpu_fault", "cannot_tell"),
    ]
    assert [v.cause for v in verdicts[3:]] == list(NOT_JUDGED)  # never faked: cannot tell, why
    assert all(v.evidence.startswith("not judged: ") for v in verdicts[3:])
    assert verdicts[0].title == "long prefills share scheduler steps with decode"
    assert data_gaps(verdicts) == ["no n readings"]  # the probe whose reading was missing
    json = verdicts[0].to_json()
    assert set(json) == {"cause", "title", "verdict", "evidence", "number", "missing"}


def test_one_replica_comes_from_the_fleet_verdict() -> None:
    edges = (0.02, 0.04, 0.06, 0.25, 0.5, math.inf)

    def ttft(counts: dict[float, int]) -> dict[str, dict[float, float]]:
        running, out = 0.0, {}
        for edge in edges:
            running += counts.get(edge, 0)
            out[edge] = running
        return {"ttft_p99_ms": out}

    fast, slow = {0.02: 10, 0.04: 28, 0.06: 2}, {0.25: 5, 0.5: 35}
    outlier = one_replica(judge_fleet({"10.0.0.7:8000": ttft(slow), "10.0.0.8:8000": ttft(fast)}))
    assert outlier.verdict == "supported" and outlier.number is not None
    assert outlier.number.startswith("10.0.0.7:8000: ")
    alike = one_replica(judge_fleet({"a:1": ttft(fast), "b:1": ttft(fast)}))
    assert alike.verdict == "ruled_out" and alike.number == "2 replicas alike"
    runbook = Runbook(name="x", probes=[{"probe": "e"}], hypotheses=[MIXING])  # type: ignore[list-item]
    fleet = judge_fleet({"10.0.0.7:8000": ttft(slow), "10.0.0.8:8000": ttft(fast)})
    both = judge(runbook, Measured.of({"e.steps": 8192.0, "e.running": 3.0}), fleet)
    assert [(v.cause, v.verdict) for v in both[:2]] == [
        ("one_replica", "supported"),
        ("prefill_decode_mixing", "supported"),
    ]  # one slow replica leads: a fleet-wide cause is not its fix
    assert judge(runbook, Measured.of({}), None)[0].cause == "prefill_decode_mixing"  # one engine


# --- the engine's step readings, on pages a real engine served --------------------------------


def test_step_readings_of_a_real_engine_window() -> None:
    """24 requests of ~210 prompt tokens, 8 abandoned (tests/fixtures/README.md): 53 steps, the
    largest in (1024, 2048]; 16 requests finished with 2.17 s queued and 13.65 s prefilling."""
    window = pages()
    bound = decode_bound(window[0], window[-1])
    assert bound == 17.0  # nothing running at the start, 17 first tokens in the window
    steps = read_steps(window, decode_bound=bound)
    assert steps.value("max_step_tokens") == 2048.0
    assert steps.reading("max_step_tokens").span == (1025.0, 2048.0)  # a bucket, never a point
    assert steps.reading("max_step_tokens").bound is None
    assert steps.value("prefill_step_share") == pytest.approx(4 / 53)  # steps > 32 tokens
    queue, prefill = 15.056003310999813 - 12.884680649000074, 76.26828603100017 - 62.618516887
    assert steps.value("queue_ttft_share") == pytest.approx(queue / (queue + prefill))
    assert steps.value("prefill_ttft_share") == pytest.approx(prefill / (queue + prefill))
    assert steps.value("waiting_capacity") == 0.0
    assert steps.value("rejections_per_s") == 0.0
    assert steps.value("cached_prompt_share") == 0.0  # 3,592 prompt tokens, none cached
    engine = SampledWindow(window).engine  # 17 first tokens, 16 finished, none left running
    assert aborted_share(engine.aborted_requests, engine.ttft_ms.count) == pytest.approx(1 / 17)
    assert aborted_share(-2.0, 10) == 0.0  # preempted ones re-queued: nothing aborted
    assert aborted_share(3.0, 10, waiting_at_end=3.0) == 0.0  # queued at the end: maybe preempted
    assert aborted_share(None, 10) is None and aborted_share(1.0, 0) is None


@pytest.mark.parametrize(
    ("family", "reading"),
    [
        ("vllm:iteration_tokens_total", "max_step_tokens"),
        ("vllm:iteration_tokens_total", "prefill_step_share"),
        ("vllm:num_requests_waiting_by_reason", "waiting_capacity"),
        ("vllm:admission_rejections_total", "rejections_per_s"),
        ("vllm:prompt_tokens_cached_total", "cached_prompt_share"),
        ("vllm:request_prefill_time_seconds", "queue_ttft_share"),
    ],
)
def test_a_metric_the_engine_lacks_reads_unknown_not_zero(family: str, reading: str) -> None:
    window = pages(drop=family)
    steps = read_steps(window, decode_bound=decode_bound(window[0], window[-1]))
    assert steps.value(reading) is None
    assert read_steps(pages(), decode_bound=17.0).value(reading) is not None


def test_the_top_buckets_read_as_bounds() -> None:
    def page(at: float, counts: dict[str, float]) -> Exposition:
        rows: list[tuple[Mapping[str, str], float]] = [({"le": le}, c) for le, c in counts.items()]
        return Exposition(at=at, samples={"vllm:iteration_tokens_total_bucket": rows})

    edges0 = {"1.0": 0.0, "16384.0": 0.0, "+Inf": 0.0}
    beyond = read_steps([page(0, edges0), page(1, {"1.0": 1, "16384.0": 1, "+Inf": 2})], None)
    assert beyond.value("max_step_tokens") == 16384.0
    assert beyond.reading("max_step_tokens").bound is Bound.MORE_THAN
    assert beyond.value("prefill_step_share") is None  # no decode bound: unknown
    first = read_steps([page(0, edges0), page(1, {"1.0": 3, "16384.0": 3, "+Inf": 3})], None)
    assert first.value("max_step_tokens") == 1.0
    assert first.reading("max_step_tokens").bound is Bound.AT_MOST


def test_fleet_merge_keeps_the_step_readings_exact() -> None:
    """Two replicas that served the same window: the steps' counts double (the largest step and
    the shares stay), the rejections and the waiting add up, nothing is counted across them."""
    one = pages()
    members = [
        Member({"replica": name}, dict(enumerate(one)))
        for name in ("10.0.0.1:8000", "10.0.0.2:8000")
    ]
    merged = merge_rounds(members, [p.at for p in one])
    alone = read_steps(one, decode_bound=decode_bound(one[0], one[-1]))
    fleet = read_steps(merged, decode_bound=decode_bound(merged[0], merged[-1]))
    assert decode_bound(merged[0], merged[-1]) == 34.0
    assert fleet.value("max_step_tokens") == alone.value("max_step_tokens")
    assert fleet.json()["spans"] == alone.json()["spans"]
    for key in (
        "prefill_step_share",
        "queue_ttft_share",
        "cached_prompt_share",
        "rejections_per_s",
    ):
        assert fleet.value(key) == pytest.approx(alone.value(key))
    assert SampledWindow(merged).engine.requests_finished == 32.0
    assert STEP_METRICS <= SAMPLED_METRICS  # the sampler keeps what the readings need


# --- the shipped runbooks ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [*sorted((REPO / "runbooks").glob("*.yaml")), REPO / "bot" / "app" / "demo" / "runbook.yaml"],
    ids=lambda p: p.name,
)
def test_shipped_runbooks_judge_the_four_engine_causes(path: Path) -> None:
    loaded = load_file(path, default_registry())
    causes = [h.cause for h in loaded.runbook.hypotheses]
    assert causes[:4] == [
        "prefill_decode_mixing",
        "kv_cache_pressure",
        "queueing",
        "abandoned_work",
    ]
    if any(step.probe == "nvml" for step in loaded.runbook.probes):
        assert "gpu_fault" in causes
    shipped = REPO / "bot" / "shipped" / "runbooks" / path.name
    if path.parent.name == "runbooks":
        assert shipped.read_text() == path.read_text()


# --- the shipped runbook, end to end on a real engine's pages and NVML faked at the wire -------


async def run_shipped(nvml: FakeNvml) -> list[CauseVerdict]:
    """The shipped vllm-latency runbook's probes on the recorded engine pages, judged."""
    from tests.test_bot_probes import PAGES, context, serve

    loaded = load_file(REPO / "runbooks" / "vllm-latency.yaml", default_registry())
    ctx, _ = context(serve({"engine/metrics": PAGES}), nvml=nvml, hostname="gpu-host")
    target = TargetRef("prod-a", Target(vllm_url="http://engine:8000"))
    result = await RunbookRunner(registry=default_registry()).run(loaded, target=target, ctx=ctx)
    return judge(loaded.runbook, result.readings)


async def test_the_shipped_runbook_on_a_real_window_with_a_power_capped_gpu() -> None:
    verdicts = await run_shipped(FakeNvml.from_file(FIXTURES.parent / "nvml" / "h200-x2.json"))
    by_cause = {v.cause: v for v in verdicts}
    # GPU 1 at its software power cap is no fault (as in the DCGM runbook); in-process NVML
    # reads no XIDs, so with no slowdown and no ECC error the GPU cannot be ruled out
    gpu = by_cause["gpu_fault"]
    assert gpu.verdict == "cannot_tell" and gpu.missing == ("nvml.xid_errors",), gpu
    assert by_cause["prefill_decode_mixing"].verdict == "ruled_out"  # steps of 1,025-2,048
    assert by_cause["prefill_decode_mixing"].number == "1,025–2,048 tokens in one scheduler step"
    assert by_cause["kv_cache_pressure"].verdict == "ruled_out"
    assert by_cause["queueing"].verdict == "ruled_out"  # 13.7 % of TTFT queued
    # 1 of 17 aborted, but its 200 prompt tokens were 5.6 % of the window's prefill (the
    # shipped VLLMWastedPrefillHigh alert's line is 5 %)
    abandoned = by_cause["abandoned_work"]
    assert (
        abandoned.verdict == "supported" and abandoned.number == "5.9 % of started requests aborted"
    )
    assert [v.cause for v in verdicts if v.verdict == "supported"] == ["abandoned_work"]
    assert cause_text.root_line(verdicts).startswith("likely cause: work for clients that left")


async def test_without_a_gpu_reading_the_gpu_cause_is_a_data_gap() -> None:
    verdicts = await run_shipped(FakeNvml.no_driver())
    gpu = next(v for v in verdicts if v.cause == "gpu_fault")
    assert gpu.verdict == "cannot_tell" and "nvml.xid_errors" in gpu.missing
    assert data_gaps(verdicts) == ["no GPU snapshot: configure `ruleloop agent` on the GPU nodes"]
    assert [v.cause for v in verdicts if v.verdict == "supported"] == ["abandoned_work"]


def test_a_step_reading_is_bounded_by_the_step_budget() -> None:
    """vLLM credits a chunked prompt's whole length to the step that completes it: a bucket
    above the engine's --max-num-batched-tokens is no step (issue 43 item 5)."""

    def page(at: float, counts: dict[str, float]) -> Exposition:
        rows: list[tuple[Mapping[str, str], float]] = [({"le": le}, c) for le, c in counts.items()]
        return Exposition(at=at, samples={"vllm:iteration_tokens_total_bucket": rows})

    zero = {"256.0": 0.0, "4096.0": 0.0, "8192.0": 0.0, "+Inf": 0.0}
    # 30 steps of at most 256 tokens, and one 6,000-token prompt credited to its last chunk
    window = [page(0, zero), page(1, {"256.0": 30, "4096.0": 30, "8192.0": 31, "+Inf": 31})]
    unbounded = read_steps(window, None)
    assert unbounded.value("max_step_tokens") == 8192.0  # the histogram's word, no more
    assert unbounded.value("step_budget") is None
    chunked = read_steps(window, None, step_budget=256)
    assert chunked.value("max_step_tokens") == 256.0
    assert chunked.reading("max_step_tokens").bound is Bound.AT_MOST
    assert chunked.value("step_budget") == 256.0
    within = read_steps(window, None, step_budget=6000)  # the bucket's top is above the budget
    assert within.value("max_step_tokens") == 6000.0
    assert within.reading("max_step_tokens").span == (4097.0, 6000.0)
    whole = read_steps(window, None, step_budget=8192)  # a whole-prompt step: the bucket stands
    assert whole.reading("max_step_tokens").span == (4097.0, 8192.0)


@pytest.mark.parametrize(
    ("budget", "verdict"),
    [(None, "cannot_tell"), (8192.0, "supported"), (2048.0, "ruled_out")],
)
def test_the_shipped_mixing_hypothesis_needs_the_step_budget(
    budget: float | None, verdict: str
) -> None:
    """A 4,097-8,192-token bucket supports step mixing only where the engine's step budget lets a
    step be that big; unknown, it cannot tell; a 2,048 budget bounds the step, which rules it out."""
    shipped = Path(__file__).parent.parent / "runbooks" / "vllm-latency.yaml"
    runbook = load_file(shipped, default_registry()).runbook
    mixing = next(h for h in runbook.hypotheses if h.cause == "prefill_decode_mixing")
    step = (4097.0, 8192.0) if budget is None or budget >= 8192 else (float(budget), float(budget))
    values = {
        "vllm_metrics.max_step_tokens": step[1], "vllm_metrics.step_budget": budget,
        "vllm_metrics.requests_running": 3.0, "vllm_metrics.tpot_p99_ms": 80.0,
    }  # fmt: skip
    spans = {"vllm_metrics.max_step_tokens": step} if step[0] < step[1] else {}
    judged = judge(Runbook(name="x", probes=runbook.probes, hypotheses=[mixing]),
                   Measured.of(values, spans=spans))  # fmt: skip
    assert judged[0].verdict == verdict, judged[0]


def test_one_token_requests_do_not_hide_a_decode_stall_in_the_tpot_p99() -> None:
    """vLLM observes TPOT 0 for a request of one output token; 995 such requests beside 5 chats
    whose tokens took 80 ms each read "TPOT p99 <= 10 ms" unless they are left out (issue 43)."""
    from bot.diagnosis.probes.sampling import SampledWindow

    def page(at: float, tpot: dict[str, float], lengths: dict[str, float], n: float) -> Exposition:
        samples: dict[str, list[tuple[Mapping[str, str], float]]] = {
            "vllm:request_time_per_output_token_seconds_bucket":
                [({"le": le}, c) for le, c in tpot.items()],
            "vllm:request_time_per_output_token_seconds_count": [({}, n)],
            "vllm:request_time_per_output_token_seconds_sum": [({}, 5 * 0.08 if n else 0.0)],
            "vllm:request_generation_tokens_bucket": [({"le": le}, c) for le, c in lengths.items()],
        }  # fmt: skip
        return Exposition(at=at, samples=samples)

    edges = ("0.01", "0.05", "0.1", "+Inf")
    zero = page(0, dict.fromkeys(edges, 0.0), {"1.0": 0.0, "2.0": 0.0, "+Inf": 0.0}, 0)
    after = page(10, {"0.01": 995, "0.05": 995, "0.1": 1000, "+Inf": 1000},
                 {"1.0": 995, "2.0": 995, "+Inf": 1000}, 1000)  # fmt: skip
    tpot = SampledWindow([zero, after]).tpot_ms
    assert tpot.count == 5
    assert tpot.p99 is not None and 50.0 < tpot.p99 <= 100.0, tpot
    assert tpot.bounds.get("p99") is None
    # without the output-length histogram nothing is left out: the bound it was
    bare = Exposition(at=10, samples={k: v for k, v in after.samples.items()
                                      if not k.startswith("vllm:request_generation")})  # fmt: skip
    diluted = SampledWindow([zero, bare]).tpot_ms
    assert diluted.count == 1000 and diluted.bounds.get("p99") is Bound.AT_MOST  # "<= 10 ms"
