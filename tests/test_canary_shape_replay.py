"""Replaying a workload shape (bot/canary/shape_replay.py), without an engine: lengths follow the
buckets, groups their shares, synthesized prefixes the hit rate, gaps the rate; clamping warns;
the CLI refuses flags that contradict the shape; the report carries the shape it sent."""

from __future__ import annotations

import json
import math
import random
import statistics
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.adr.workload.shape import Prefix, WorkloadShape, dumps, parse
from bot.app.cli.canary import canary
from bot.canary.runner import CanaryRun, pattern
from bot.canary.shape_replay import (
    FIXED_SOURCE,
    Plan,
    ShapeReplay,
    default_cap,
    fixed_shape,
    length_edges,
    stratified,
)
from bot.canary.workload import Workload
from tests.fakes.sse_engine import SseEngine
from tests.test_workload_fidelity_engine import ORIGINAL, fidelity_problems

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def shape_of(
    prompt: dict[str, float],
    output: dict[str, float] | None = None,
    *,
    prefix: str = "{}",
    rate: float = 4.0,
    burstiness: float | None = None,
) -> WorkloadShape:
    """A shape written as a person would (YAML), through the real parser."""
    output = output or {"10": 0.5, "20": 0.5}
    return parse(
        f"""
version: 1
source: file
captured_at: '2026-12-01T00:00:00Z'
prompt_tokens: {{count: 100, buckets: {json.dumps(prompt)}}}
output_tokens: {{count: 100, buckets: {json.dumps(output)}}}
prefix: {prefix}
arrivals: {{request_rate: {rate}, burstiness: {"null" if burstiness is None else burstiness}}}
""",
        kind="yaml",
    )


MIX = {"100": 0.0, "200": 0.3, "500": 0.4, "1000": 0.3, "+Inf": 0.0}


def plans(replay: ShapeReplay, n: int) -> list[Plan]:
    return [replay.plan() for _ in range(n)]


def bucket_of(length: int, edges: Sequence[float]) -> float:
    return next(edge for edge in edges if length <= edge)


def simulated_hit_rate(planned: Sequence[Plan], block_size: int) -> float:
    """vLLM's prefix cache on these prompts, in order, with room for all: a prompt hits its
    leading full blocks that an earlier prompt computed, up to its last token (never cached)."""
    cached: set[int] = set()
    hits = queries = 0
    for plan in planned:
        ids, chain, key = plan.prompt_ids, [], 0
        for start in range(0, len(ids) // block_size * block_size, block_size):
            key = hash((key, tuple(ids[start : start + block_size])))
            chain.append(key)
        for key in chain[: (len(ids) - 1) // block_size]:
            if key not in cached:
                break
            hits += block_size
        cached.update(chain)
        queries += len(ids)
    return hits / queries


# -- lengths ---------------------------------------------------------------------------
def test_sampled_lengths_follow_the_buckets() -> None:
    replay = ShapeReplay(shape_of(MIX), seed=3, count=1000)
    drawn = plans(replay, 1000)
    edges = [100.0, 200.0, 500.0, 1000.0, math.inf]
    by_bucket = Counter(bucket_of(p.prompt_tokens, edges) for p in drawn)
    assert by_bucket == {200.0: 300, 500.0: 400, 1000.0: 300}  # stratified: exact shares
    assert Counter(bucket_of(p.output_tokens, [10, 20]) for p in drawn) == {10: 500, 20: 500}
    # Uniform inside a bucket: ten equal slices of (500, 1000], chi-square against 30 each.
    inside = [p.prompt_tokens for p in drawn if p.prompt_tokens > 500]
    slices = Counter((n - 501) * 10 // 500 for n in inside)
    chi2 = sum((slices[i] - 30) ** 2 / 30 for i in range(10))
    assert chi2 < 27.9  # 9 degrees of freedom, p = 0.001
    assert min(inside) >= 501 and max(inside) <= 1000
    # ... and the shape's p50 (350, interpolated in (200, 500]) comes back.
    assert statistics.median(p.prompt_tokens for p in drawn) == pytest.approx(350, abs=20)


@settings(max_examples=40, deadline=None)
@given(
    shares=st.lists(st.integers(0, 20), min_size=2, max_size=6).filter(lambda s: sum(s) > 0),
    n=st.integers(1, 300),
)
def test_every_block_holds_each_bucket_its_share(shares: list[int], n: int) -> None:
    total = sum(shares)
    picks = Counter(stratified([s / total for s in shares], n, random.Random(n)))
    assert sum(picks.values()) == n
    for i, share in enumerate(shares):
        assert abs(picks[i] - share / total * n) < 1  # largest remainder: within one


def test_the_inf_bucket_is_replayed_as_wide_as_the_last_finite_one_and_said() -> None:
    replay = ShapeReplay(shape_of({"1000": 0.5, "2000": 0.25, "+Inf": 0.25}), count=400)
    longest = [p.prompt_tokens for p in plans(replay, 400) if p.prompt_tokens > 2000]
    assert len(longest) == 100 and min(longest) >= 2001 and max(longest) <= 3000
    assert replay.warnings() == [
        "prompt_tokens: 25.0% of the requests are longer than 2,000 tokens (the +Inf bucket); "
        "replayed as 2,001-3,000 tokens, as wide as the last finite bucket"
    ]


def test_lengths_are_clamped_to_max_model_len_with_a_warning() -> None:
    shape = shape_of({"2000": 0.5, "5000": 0.5}, {"500": 0.5, "1000": 0.5})
    replay = ShapeReplay(shape, count=100, max_model_len=2048)
    drawn = plans(replay, 100)
    assert all(p.prompt_tokens + p.output_tokens <= 2048 for p in drawn)
    assert replay.clamped_prompts == sum(1 for p in drawn if p.prompt_tokens + p.output_tokens
                                         == 2048) > 50  # fmt: skip
    [warning] = replay.warnings()
    assert warning.startswith(f"clamped {replay.clamped_prompts} of 100 prompts to the engine's")
    assert "max_model_len 2,048" in warning
    unclamped = ShapeReplay(shape, count=100, max_model_len=16384)
    plans(unclamped, 100)
    assert unclamped.warnings() == [] and unclamped.clamped_prompts == 0


def test_a_replay_is_deterministic_and_the_salt_changes_only_the_tokens() -> None:
    shape = shape_of(MIX, prefix="{hit_rate: 0.3}")

    def run(salt: str) -> tuple[list[Plan], list[float]]:
        replay = ShapeReplay(shape, seed=5, count=50, block_size=16, salt=salt)
        return plans(replay, 50), [replay.gap() for _ in range(50)]

    (a, gaps_a), (b, gaps_b), (c, gaps_c) = run("x"), run("x"), run("y")
    assert a == b and gaps_a == gaps_b
    assert [(p.prompt_tokens, p.output_tokens, p.prefix_tokens) for p in a] == [
        (p.prompt_tokens, p.output_tokens, p.prefix_tokens) for p in c
    ]
    assert gaps_a == gaps_c
    assert all(p.prompt_ids != q.prompt_ids for p, q in zip(a, c, strict=True))


# -- prefixes --------------------------------------------------------------------------
def test_declared_groups_get_their_share_and_one_fixed_prefix_each() -> None:
    prefix = "{groups: [{share: 0.5, length: 300}, {share: 0.2, length: 64}]}"
    replay = ShapeReplay(shape_of(MIX, prefix=prefix), count=1000, block_size=16)
    drawn = plans(replay, 1000)
    assert Counter(p.group for p in drawn) == {0: 500, 1: 200, None: 300}
    for group, length in ((0, 300), (1, 64)):
        members = [p for p in drawn if p.group == group]
        first = members[0].prompt_ids[:length]
        for p in members:
            shared = min(length, p.prompt_tokens - 1)
            assert p.prefix_tokens == shared and p.prompt_ids[:shared] == first[:shared]
    # The two groups' prefixes differ from the first token on; the rest share nothing.
    zero, one = (next(p for p in drawn if p.group == g).prompt_ids for g in (0, 1))
    assert zero[:16] != one[:16]
    assert all(p.prefix_tokens == 0 for p in drawn if p.group is None)
    short = sum(1 for p in drawn if p.group == 0 and p.prompt_tokens <= 300)
    assert short > 0
    assert replay.warnings() == [
        f"prefix group 1 (300 tokens): {short} of its 500 requests were drawn shorter than the "
        "prefix and share only their first n - 1 tokens of it"
    ]


@settings(max_examples=25, deadline=None)
@given(
    hit_rate=st.floats(0.02, 0.95),
    block_size=st.sampled_from([16, 128]),
    n=st.integers(20, 150),
    seed=st.integers(0, 1000),
)
def test_groups_synthesized_from_a_hit_rate_give_that_hit_rate(
    hit_rate: float, block_size: int, n: int, seed: int
) -> None:
    shape = shape_of(MIX, prefix=f"{{hit_rate: {hit_rate}}}")
    replay = ShapeReplay(shape, seed=seed, count=n, block_size=block_size)
    drawn = plans(replay, n)
    assert all(p.prefix_tokens % block_size == 0 for p in drawn)  # whole blocks only
    simulated = simulated_hit_rate(drawn, block_size)
    assert simulated == pytest.approx(replay.planned_hit_rate())
    prompt_tokens = sum(p.prompt_tokens for p in drawn)
    if replay.shortfall is None:
        assert abs(simulated - hit_rate) <= block_size / prompt_tokens + 1e-9
    else:  # asked for more than whole blocks inside the prompts can hit: the most, and said
        assert simulated == pytest.approx(replay.shortfall, abs=block_size / prompt_tokens)
        assert "is above what whole" in replay.warnings()[-1]


def test_a_replay_that_ignores_the_prefixes_fails_the_fidelity_bound() -> None:
    captured = parse(ORIGINAL.replace("groups: [{share: 0.6, length: 384}]", "hit_rate: 0.35"),
                     kind="yaml")  # fmt: skip

    def replayed(shape: WorkloadShape) -> WorkloadShape:
        drawn = plans(ShapeReplay(shape, seed=1, count=60, block_size=128), 60)
        hit = simulated_hit_rate(drawn, 128)
        return captured.model_copy(update={"prefix": Prefix(hit_rate=hit)})

    assert fidelity_problems(captured, replayed(captured)) == []
    ignoring = captured.model_copy(update={"prefix": Prefix()})  # lengths and rate only
    assert fidelity_problems(captured, replayed(ignoring)) == ["prefix-cache hit rate 0.35 -> 0.0"]


# -- arrivals --------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(
    rate=st.floats(0.1, 500),
    burstiness=st.one_of(st.none(), st.floats(0.1, 20)),
    count=st.integers(1, 400),
)
def test_gaps_have_mean_one_over_the_rate(
    rate: float, burstiness: float | None, count: int
) -> None:
    replay = ShapeReplay(shape_of(MIX, rate=rate, burstiness=burstiness), count=count)
    gaps = [replay.gap() for _ in range(count)]
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=1e-9)
    assert all(gap >= 0 for gap in gaps)


@pytest.mark.parametrize(("burstiness", "cv"), [(None, 1.0), (1.0, 1.0), (0.25, 2.0), (16, 0.25)])
def test_burstiness_is_the_gamma_shape_of_the_gaps(burstiness: float | None, cv: float) -> None:
    replay = ShapeReplay(shape_of(MIX, rate=10, burstiness=burstiness), count=4000, seed=2)
    gaps = [replay.gap() for _ in range(4000)]
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.1)


# -- the fixed workload's shape --------------------------------------------------------
def test_a_fixed_workload_describes_its_shape_in_vllm_buckets() -> None:
    poisson = Workload(
        endpoint="http://x/v1/completions", request_rate=5.0, num_requests=40,
        prompt_length=300, prefix_length=100, output_length=64,
    )  # fmt: skip
    shape = fixed_shape(poisson, max_model_len=2048, captured_at=T0)
    assert shape.source == FIXED_SOURCE and shape.api == "completions"
    assert list(shape.prompt_tokens.buckets) == [
        "1", "2", "5", "10", "20", "50", "100", "200", "500", "1000", "2000", "+Inf",
    ]  # fmt: skip
    assert shape.prompt_tokens.buckets["500"] == 1.0 and shape.prompt_tokens.count == 40
    assert shape.output_tokens.buckets["100"] == 1.0 and shape.output_tokens.mean == 64
    assert [g.model_dump() for g in shape.prefix.groups] == [{"share": 1.0, "length": 100}]
    assert shape.arrivals.model_dump() == {
        "request_rate": 5.0, "concurrency": None, "burstiness": 1.0,
        "replicas": 1, "per": "replica",  # a canary loads one endpoint: one replica's traffic
    }  # fmt: skip
    steady = Workload(endpoint="http://x/v1/completions", concurrency=8, prompt_length=128)
    shape = fixed_shape(steady, request_rate=12.5, captured_at=T0)
    assert shape.prefix.groups == () and shape.arrivals.concurrency == 8.0
    assert shape.arrivals.request_rate == 12.5 and shape.arrivals.burstiness is None
    assert length_edges()[-2] == 10_000  # vLLM's edges when max_model_len is unknown
    with pytest.raises(ValueError, match="measured rate"):
        fixed_shape(steady)
    # A fixed shape replays as the fixed workload: one bucket, the prefix shared by all.
    drawn = plans(ShapeReplay(fixed_shape(poisson, captured_at=T0), count=20), 20)
    assert all(201 <= p.prompt_tokens <= 500 and p.prefix_tokens == 100 for p in drawn)


def test_the_default_in_flight_cap_leaves_room_for_the_shapes_concurrency() -> None:
    shape = shape_of(MIX)
    assert default_cap(shape) == 10
    busy = shape.model_copy(update={"arrivals": shape.arrivals.model_copy(
        update={"concurrency": 7.9})})  # fmt: skip
    assert default_cap(busy) == 32


# -- the CLI ---------------------------------------------------------------------------
@pytest.fixture
def shape_file(tmp_path: Path) -> Path:
    path = tmp_path / "prod.yaml"
    path.write_text(dumps(shape_of(MIX, prefix="{hit_rate: 0.3}"), "yaml"))
    return path


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--prompt-length", "256"], "--prompt-length contradicts --workload: the shape's "
         "prompt_tokens decides that; drop it"),
        (["--output-length", "8", "--request-rate", "3"], "--output-length, --request-rate "
            "contradict --workload: the shape's output_tokens, arrivals.request_rate decide that; "
            "drop them"),
        (["--prefix-length", "16"], "--prefix-length contradicts --workload"),
        (["--pulse"], "--pulse contradicts --workload"),
        (["--no-ignore-eos"], "--no-ignore-eos contradicts --workload"),
    ],
)  # fmt: skip
def test_flags_that_contradict_the_shape_are_refused(
    shape_file: Path, extra: list[str], message: str
) -> None:
    args = ["--endpoint", "http://127.0.0.1:9/v1/completions", "--workload", str(shape_file)]
    result = CliRunner().invoke(canary, [*args, *extra])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: 1\nsource: file\n", "bad.yaml: captured_at: required"),
        ("[1, 2]", "bad.yaml: holds list, not a shape"),
    ],
)
def test_a_bad_shape_file_exits_2_with_the_shape_errors_one_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = CliRunner().invoke(
        canary, ["--endpoint", "http://127.0.0.1:9/v1/completions", "--workload", str(path)]
    )
    assert result.exit_code == 2
    [line] = [line for line in result.output.splitlines() if line]
    assert line.startswith("error: ") and message in line


def test_help_names_the_workload_flag() -> None:
    result = CliRunner().invoke(canary, ["--help"])
    assert "--workload" in result.output and "--workload prod.yaml" in result.output


# -- a run and its report --------------------------------------------------------------
async def test_a_replay_sends_the_shapes_lengths_and_reports_the_shape() -> None:
    shape = shape_of(MIX, {"5": 0.5, "10": 0.5}, prefix="{hit_rate: 0.3}", rate=200)
    async with SseEngine() as engine:
        workload = Workload(
            endpoint=f"{engine.base_url}/v1/completions", shape=shape, num_requests=30,
            concurrency=8, seed=4,
        )  # fmt: skip
        run = CanaryRun(workload)
        report = await run.run()
    # What reached the engine: the lengths the same seed plans (the salt changes only tokens).
    expected = plans(ShapeReplay(shape, seed=4, count=30), 30)
    assert sorted(r.output_tokens for r in run.records) == sorted(p.output_tokens for p in expected)
    assert sorted(r.planned_prompt_tokens for r in run.records) == sorted(
        p.prompt_tokens for p in expected
    )
    assert report.shape is shape
    data = report.report().json_dict()
    assert data["workload_shape"] == shape.model_dump(mode="json")
    json.dumps(data)  # the whole report is JSON
    assert data["workload"]["pattern"] == pattern(workload) == {
        "kind": "shape", "requests_per_s": 200.0, "burstiness": None, "max_in_flight": 8,
    }  # fmt: skip
    assert data["workload"]["prompt_length"] is None and data["workload"]["shape"] == "file"
    replay = data["workload"]["replay"]
    assert replay["planned"] == 30 and replay["prefix"]["construction"] == (
        "synthesized from hit_rate"
    )
    assert "/v1/models gives no max_model_len" in " ".join(data["warnings"])


async def test_a_fixed_run_reports_the_shape_its_parameters_describe() -> None:
    async with SseEngine() as engine:
        workload = Workload(
            endpoint=f"{engine.base_url}/v1/completions", num_requests=12, concurrency=3,
            prompt_length=40, prefix_length=8, output_length=4,
        )  # fmt: skip
        report = await CanaryRun(workload).run()
    shape = report.report().json_dict()["workload_shape"]
    assert shape["source"] == FIXED_SOURCE
    assert shape["prompt_tokens"]["buckets"]["50"] == 1.0
    assert shape["output_tokens"]["buckets"]["5"] == 1.0
    assert shape["prefix"]["groups"] == [{"share": 1.0, "length": 8}]
    assert shape["arrivals"]["concurrency"] == 3.0 and shape["arrivals"]["request_rate"] > 0
    assert report.report().json_dict()["workload"]["shape"] is None
