"""`ruleloop workload diff`: drifted both ways, alike for the same traffic, 2 on bad input, and
each dimension against its own threshold."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.adr.workload import diff as diffs
from bot.adr.workload import shape as shapes
from bot.adr.workload.shape import Lengths, WorkloadShape
from bot.app.cli import cli
from bot.diagnosis.probes.vllm_metrics import parse_page
from bot.diagnosis.probes.workload_capture import CAPTURE_METRICS, shape_from_pages
from bot.kernel.numbers.reading import Bound
from tests.workload_pages import CAPTURED_AT, chat, lengths, long_system_prompt, shape, vllm_page


def write(tmp_path: Path, name: str, s: WorkloadShape) -> Path:
    path = tmp_path / name
    shapes.save(s, path)
    return path


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["workload", "diff", *args])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def test_long_system_prompts_against_chats_drifted(tmp_path: Path) -> None:
    old, new = long_system_prompt(), chat()
    assert old.prompt_tokens.p50 == 3500 and 100 < new.prompt_tokens.p50 < 200
    code, out = run(
        str(write(tmp_path, "agents.yaml", old)), str(write(tmp_path, "chat.json", new))
    )
    assert code == 1, out
    lines = out.splitlines()
    p50 = re.compile(
        r"prompt tokens p50 2,000–5,000 -> 100–200 tokens \(more than 10\.0x smaller, limit 2x\): "
        r"DRIFTED$"
    )
    assert any(p50.match(line) for line in lines), out
    assert any(
        line.startswith("prompt tokens distribution:") and "DRIFTED" in line for line in lines
    )
    # the outputs are alike: only the prompts drifted
    assert all("DRIFTED" not in line for line in lines if line.startswith("output tokens"))
    assert lines[-1].endswith(": drifted")


def test_chats_against_long_system_prompts_drifted_too(tmp_path: Path) -> None:
    code, out = run(
        str(write(tmp_path, "chat.yaml", chat())),
        str(write(tmp_path, "agents.yaml", long_system_prompt())),
    )
    assert code == 1, out
    assert re.search(
        r"prompt tokens p50 100–200 -> 2,000–5,000 tokens \(more than 10\.0x bigger, limit 2x\): "
        r"DRIFTED",
        out,
    ), out


def test_json_names_the_drifted_dimensions(tmp_path: Path) -> None:
    old, new = write(tmp_path, "a.yaml", long_system_prompt()), write(tmp_path, "b.yaml", chat())
    code, out = run(str(old), str(new), "--json")
    assert code == 1
    result = json.loads(out)
    assert result["drifted"] is True
    assert result["drifted_dimensions"] == [
        "prompt_tokens.distribution", "prompt_tokens.p50", "prompt_tokens.p99",
    ]  # fmt: skip
    by_name = {d["name"]: d for d in result["dimensions"]}
    p50 = by_name["prompt_tokens.p50"]
    # no interpolated point: the buckets, and the factor their nearest edges give
    assert p50["old"] is None and p50["new"] is None and p50["threshold"] == 2.0
    assert (p50["old_range"], p50["new_range"]) == (["2000", "5000"], ["100", "200"])
    assert p50["drifted"] is True and p50["distance"] == 10.0
    ks = by_name["prompt_tokens.distribution"]
    assert ks["distance"] == 1.0 and ks["threshold"] == diffs.KS_LIMIT
    assert set(by_name["arrivals.request_rate"]) >= {"name", "old", "new", "distance", "threshold"}


def same_traffic_pages(seed: int) -> list[str]:
    """Three pages of one engine: a mix of chats and long prompts, two 60 s windows of it."""
    rng = random.Random(seed)

    def request() -> tuple[int, int]:
        if rng.random() < 0.7:
            return rng.randint(50, 300), rng.randint(20, 300)
        return rng.randint(1000, 4000), rng.randint(20, 300)

    done: list[tuple[int, int]] = []
    pages, hits, queries = [], 0.0, 0.0
    for count in (0, 240, 230):
        new = [request() for _ in range(count)]
        done += new
        queries += sum(p for p, _ in new)
        hits += 0.3 * sum(p for p, _ in new)
        pages.append(
            vllm_page(
                prompts=[p for p, _ in done],
                outputs=[o for _, o in done],
                running=rng.uniform(6, 10),
                hits=hits,
                queries=queries,
            )  # fmt: skip
        )
    return pages


def test_two_captures_of_the_same_traffic_are_alike(tmp_path: Path) -> None:
    texts = same_traffic_pages(7)
    pages = [
        parse_page(text, url="m", at=60.0 * i, only=CAPTURE_METRICS) for i, text in enumerate(texts)
    ]
    first = shape_from_pages(pages[:2], url="http://vllm:8000/metrics", captured_at=CAPTURED_AT)
    second = shape_from_pages(pages[1:], url="http://vllm:8000/metrics", captured_at=CAPTURED_AT)
    assert first.prompt_tokens.count == 240 and second.prompt_tokens.count == 230
    code, out = run(str(write(tmp_path, "a.yaml", first)), str(write(tmp_path, "b.json", second)))
    assert code == 0, out
    assert "DRIFTED" not in out and out.splitlines()[-1].endswith(": alike")
    assert len(out.splitlines()) == 9  # eight dimensions and the verdict


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.yaml", "b.yaml"], "missing.yaml: cannot read: No such file"),
        (
            ["a.yaml", "bad.yaml"],
            "bad.yaml: api: Input should be 'completions', 'chat' or 'unknown'",
        ),
        (["a.yaml", "shape.txt"], "shape.txt: a shape file ends in .json, .yaml or .yml"),
        (["a.yaml"], "Missing argument 'NEW'"),
    ],
)
def test_bad_input_exits_2(tmp_path: Path, args: list[str], message: str) -> None:
    write(tmp_path, "a.yaml", chat())
    write(tmp_path, "b.yaml", chat())
    (tmp_path / "bad.yaml").write_text(
        (tmp_path / "a.yaml").read_text().replace("api: completions", "api: grpc")
    )
    (tmp_path / "shape.txt").write_text("version: 1\n")
    code, out = run(*(str(tmp_path / a) for a in args))
    assert code == 2, out
    assert message in out, out


def test_help_teaches() -> None:
    result = CliRunner().invoke(cli, ["workload", "diff", "--help"])
    assert result.exit_code == 0
    assert "ruleloop workload diff baseline.yaml prod.yaml" in result.output
    assert "Exit codes: 0 alike, 1 a dimension drifted, 2 bad input" in result.output
    group = CliRunner().invoke(cli, ["workload", "--help"])
    assert "ruleloop workload capture --metrics-url" in group.output


def edged(edges: dict[str, float]) -> Lengths:
    return Lengths(count=100, buckets=edges)


def test_the_line_for_a_tail_that_grew() -> None:
    old = edged({"500": 0.0, "512": 0.99, "1000": 0.01})
    new = edged({"2000": 0.0, "2048": 0.99, "4096": 0.01})
    assert (old.p99, new.p99) == (512.0, 2048.0)
    dim = diffs.quantile_ratio("prompt_tokens", "prompt tokens", "p99", old, new)
    assert dim.line == (
        "prompt tokens p99 500–512 -> 2,000–2,048 tokens (more than 3.9x bigger, limit 2x): DRIFTED"
    )
    assert (dim.old, dim.new, dim.distance, dim.threshold, dim.drifted) == (
        None,
        None,
        round(2000 / 512, 4),
        2.0,
        True,
    )
    # no shared finite edge: the distributions are not compared, and that is not drift
    ks = diffs.distribution("prompt_tokens", "prompt tokens", old, new)
    assert not ks.drifted and not ks.decided and "not compared" in ks.line


def test_a_ratio_inside_the_limit_even_at_the_far_edges_is_alike() -> None:
    old = edged({"500": 0.0, "512": 0.99, "1000": 0.01})
    new = edged({"900": 0.0, "1000": 0.99, "2000": 0.01})  # at most 1,000 / 500 = 2.0x
    dim = diffs.quantile_ratio("prompt_tokens", "prompt tokens", "p99", old, new)
    assert dim.line == (
        "prompt tokens p99 500–512 -> 900–1,000 tokens (more than 1.7x bigger, limit 2x): alike"
    )
    assert not dim.drifted and dim.decided
    wider = edged({"1000": 0.0, "1020": 0.99, "2000": 0.01})  # 1.95x to 2.04x: cannot tell
    dim = diffs.quantile_ratio("prompt_tokens", "prompt tokens", "p99", old, wider)
    assert dim.line.endswith("(more than 1.9x bigger, limit 2x): undecided (from 1.9x to 2.1x)")
    assert not dim.drifted and not dim.decided


def test_bounds_decide_only_where_they_can() -> None:
    beyond = lengths([100] * 90 + [20000] * 10)  # p99 > 10,000
    also_beyond = lengths([50] * 95 + [30000] * 5)
    short = lengths([100] * 100)  # p99 ~100
    assert beyond.bounds["p99"] is Bound.MORE_THAN
    both = diffs.quantile_ratio("prompt_tokens", "prompt tokens", "p99", beyond, also_beyond)
    assert not both.drifted  # the same +Inf bucket: no change the histogram can see
    assert both.line == (
        "prompt tokens p99 > 10,000 -> > 10,000 tokens (about the same bucket, limit 2x): alike"
    )
    fell = diffs.quantile_ratio("prompt_tokens", "prompt tokens", "p99", beyond, short)
    assert fell.drifted and fell.decided and "more than 100.0x smaller" in fell.line
    first = lengths([1] * 100)  # p99 <= 1: at most the first edge
    rose = diffs.quantile_ratio("output_tokens", "output tokens", "p99", first, short)
    assert rose.drifted and rose.line.startswith("output tokens p99 ≤ 1 -> 50–100 tokens")


@pytest.mark.parametrize(
    ("change", "drifted"),
    [
        ({"hit_rate": 0.55}, ["prefix.hit_rate"]),  # +25 points
        ({"hit_rate": 0.45}, []),  # +15 points
        ({"hit_rate": None}, []),  # not compared
        ({"rate": 6.5}, ["arrivals.request_rate"]),  # +62 %
        ({"rate": 1.9}, ["arrivals.request_rate"]),  # -52 %
        ({"rate": 5.6}, []),  # +40 %
    ],
)
def test_each_dimension_has_its_own_threshold(
    change: dict[str, float | None], drifted: list[str]
) -> None:
    rng = random.Random(3)
    prompts = [rng.randint(100, 900) for _ in range(300)]
    outputs = [rng.randint(20, 300) for _ in range(300)]
    old = shape(prompts, outputs, rate=4.0, hit_rate=0.3)
    new = shape(
        prompts, outputs, rate=float(change.get("rate") or 4.0),
        hit_rate=change.get("hit_rate", 0.3),
    )  # fmt: skip
    result = diffs.diff(old, new)
    assert [d.name for d in result.dimensions if d.drifted] == drifted
    assert result.drifted is bool(drifted)


def test_the_lines_for_hit_rate_and_request_rate() -> None:
    rate = diffs.request_rate(4.0, 10.0)
    assert rate.line == "request rate 4 -> 10 req/s (+150 %, limit 50 %): DRIFTED"
    hit = diffs.hit_rate(0.1, 0.45)
    assert (
        hit.line == "prefix-cache hit rate 10.0 % -> 45.0 % (+35 points, limit 20 points): DRIFTED"
    )
    assert diffs.hit_rate(None, 0.2).line.endswith("not compared (a shape has no hit rate)")


def test_a_small_sample_says_its_ks_is_noisy() -> None:
    few = diffs.distribution(
        "prompt_tokens", "prompt tokens", lengths([100] * 10), lengths([150] * 10)
    )
    assert few.drifted and "with 10 and 10 requests, sampling alone can reach 0.61" in few.line
