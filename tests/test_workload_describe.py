"""The one line an ADR's Context says a workload shape in: quantiles (bounds as bounds), prefix
groups or else the prefix-cache hit rate, and how requests arrive; a length quantile as the bucket
it fell in, other numbers as `show` writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.adr.workload.describe import context_line
from bot.adr.workload.shape import Arrivals, Lengths, Prefix, PrefixGroup, WorkloadShape
from bot.canary.shape_replay import fixed_shape
from bot.canary.workload import Workload
from tests.workload_pages import chat, lengths, long_system_prompt, shape


def _exact(p50_edge: str, p99_edge: str) -> Lengths:
    """Lengths whose p50 and p99 fall on the given edges: none up to half the first, 50 % up to
    it, 49 % more up to the second and the last 1 % up to twice that."""
    lower, upper = str(int(p50_edge) // 2), str(int(p99_edge) * 2)
    buckets = {lower: 0.0, p50_edge: 0.5, p99_edge: 0.49, upper: 0.01, "+Inf": 0.0}
    return Lengths(count=100, buckets=buckets)


def _with(base: WorkloadShape, **changes: object) -> WorkloadShape:
    return WorkloadShape.model_validate(base.model_dump() | changes)


def test_the_briefs_example_reads_as_one_sentence() -> None:
    measured = _with(
        chat(),
        prompt_tokens=_exact("512", "2048"),
        output_tokens=Lengths(count=100, buckets={"64": 0.0, "128": 0.5, "256": 0.5}),
        prefix=Prefix(hit_rate=0.55, groups=(PrefixGroup(share=0.4, length=1024),)),
        arrivals=Arrivals(request_rate=3.0),
    )
    assert measured.prompt_tokens.p50 == 512.0 and measured.prompt_tokens.p99 == 2048.0
    # a quantile on an edge is still anywhere in its bucket: (256, 512], not "512"
    # declared groups say more than the hit rate, which is left out beside them
    assert context_line(measured) == (
        "Measured at prompt p50 256–512 / p99 512–2,048 tokens, output p50 64–128 tokens, "
        "40.0 % sharing a 1,024-token prefix, 3 req/s."
    )


def test_a_captured_shape_says_its_hit_rate_and_concurrency() -> None:
    assert context_line(chat()) == (
        "Measured at prompt p50 100–200 / p99 100–200 tokens, output p50 200–500 tokens, "
        "30.0 % prefix-cache hits, 4 req/s, 8 concurrent."
    )


def test_quantiles_inside_one_bucket_read_as_that_bucket() -> None:
    """Prompts of 2,100-3,900 tokens all fall in vLLM's 2,000-5,000 bucket: the line says that
    bucket, not a point interpolated inside it, as `ruleloop workload diff` compares them."""
    agents = long_system_prompt()
    assert context_line(agents) == (
        "Measured at prompt p50 2,000–5,000 / p99 2,000–5,000 tokens, output p50 200–500 tokens, "
        "30.0 % prefix-cache hits, 4 req/s, 8 concurrent."
    )
    only_edges = shape([1] * 5, [20_000] * 5, hit_rate=None)  # the first bucket, the +Inf one
    assert context_line(only_edges).startswith(
        "Measured at prompt p50 ≤ 1 / p99 ≤ 1 tokens, output p50 > 10,000 tokens, "
    )


def test_a_canarys_fixed_workload_reads_as_what_it_sent() -> None:
    """The shape a fixed canary run describes (what its report carries): its one prefix group
    shared by every request, and the streams and the rate the run measured."""
    workload = Workload(
        endpoint="http://127.0.0.1:9/v1/completions", concurrency=8, num_requests=32,
        prompt_length=2048, prefix_length=1536, output_length=64,
    )  # fmt: skip
    assert context_line(fixed_shape(workload, request_rate=3.2)) == (
        "Measured at prompt p50 2,000–5,000 / p99 2,000–5,000 tokens, output p50 50–100 tokens, "
        "100.0 % sharing a 1,536-token prefix, 3.2 req/s, 8 concurrent."
    )


def test_bounds_are_written_as_bounds() -> None:
    measured = shape([1] * 15 + [100] * 5, [20_000] * 15 + [3000] * 5, hit_rate=None, rate=0.25)
    assert measured.prompt_tokens.bounds == {"p50": "<="}
    assert measured.output_tokens.bounds["p50"] == ">"
    assert context_line(measured) == (
        "Measured at prompt p50 ≤ 1 / p99 50–100 tokens, output p50 > 10,000 tokens, "
        "0.25 req/s, 8 concurrent."  # no hit rate measured: nothing said about prefixes
    )


def test_several_groups_each_say_their_share_and_length() -> None:
    agents = _with(
        chat(),
        prefix=Prefix(
            groups=(PrefixGroup(share=0.25, length=1536), PrefixGroup(share=0.125, length=64))
        ),
        arrivals=Arrivals(request_rate=12.5, concurrency=None),
    )
    assert context_line(agents) == (
        "Measured at prompt p50 100–200 / p99 100–200 tokens, output p50 200–500 tokens, "
        "25.0 % sharing a 1,536-token prefix, 12.5 % sharing a 64-token prefix, 12.5 req/s."
    )


@pytest.mark.parametrize(("hit_rate", "said"), [(0.0, "0.0 % prefix-cache hits"), (1.0, "100.0 %")])
def test_a_hit_rate_of_zero_or_one_is_still_said(hit_rate: float, said: str) -> None:
    line = context_line(shape([100] * 10, [10] * 10, hit_rate=hit_rate))
    assert said in line


def test_the_line_follows_the_shape_it_is_given() -> None:
    """Two shapes that differ in each dimension give two lines that differ there."""
    a, b = chat(), shape([3000] * 50, [16] * 50, rate=40.0, hit_rate=0.9)
    assert lengths([3000] * 50).p50 != chat().prompt_tokens.p50
    line_a, line_b = context_line(a), context_line(b)
    assert "p50 100–200 " in line_a and "p50 100–200 " not in line_b
    assert "90.0 % prefix-cache hits" in line_b and "40 req/s" in line_b


def test_the_docs_quote_the_line_the_code_writes() -> None:
    docs = Path(__file__).parent.parent / "docs"
    for page in ("workload.md", "adr.md"):
        text = " ".join((docs / page).read_text(encoding="utf-8").split())
        assert context_line(chat()) in text, page
