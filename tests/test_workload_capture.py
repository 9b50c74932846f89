"""Capturing a shape from /metrics pages: vLLM 0.32's recorded pages, pages built with other
histogram counts, the refusals (no request finished, a restart, no histograms), and the CLI
against a real HTTP server replaying pages."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.adr.workload import shape as shapes
from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.vllm_metrics import parse_page
from bot.diagnosis.probes.workload_capture import (
    CAPTURE_METRICS,
    CaptureProgress,
    capture,
    shape_from_pages,
)
from bot.kernel.errors import ProbeError, UsageError
from tests.fakes.metrics_server import RecordedMetrics
from tests.workload_pages import CAPTURED_AT, vllm_page

VLLM = Path(__file__).parent / "fixtures" / "vllm-0.32.0"
URL = "http://vllm:8000/metrics"


def recorded(name: str, at: float) -> Exposition:
    return parse_page((VLLM / f"{name}.prom").read_text(), url=URL, at=at, only=CAPTURE_METRICS)


def page(text: str, at: float) -> Exposition:
    return parse_page(text, url=URL, at=at, only=CAPTURE_METRICS)


def test_the_recorded_vllm_window() -> None:
    before, during, after = (
        recorded("before", 0.0),
        recorded("during", 5.0),
        recorded("after", 10.0),
    )
    shape = shape_from_pages([before, during, after], url=URL, captured_at=CAPTURED_AT)
    full = Exposition.parse((VLLM / "after.prom").read_text(), at=0)
    start = Exposition.parse((VLLM / "before.prom").read_text(), at=0)
    count = "vllm:request_prompt_tokens_count"
    finished = (full.total(count) or 0.0) - (start.total(count) or 0.0)
    assert finished == 16
    assert shape.prompt_tokens.count == shape.output_tokens.count == 16
    assert shape.arrivals.request_rate == pytest.approx(16 / 10.0)
    # the 16 prompts all fell in vLLM's (200, 500] bucket, the outputs in (20, 50]
    assert shape.prompt_tokens.buckets["500"] == 1.0
    assert shape.output_tokens.buckets["50"] == 1.0
    assert list(shape.prompt_tokens.buckets) == [
        "1", "2", "5", "10", "20", "50", "100", "200", "500", "1000", "2000", "5000", "10000",
        "+Inf",
    ]  # fmt: skip
    assert shape.prompt_tokens.p50 == 350.0 and shape.prompt_tokens.p99 == 497.0
    sums = [p.total("vllm:request_prompt_tokens_sum") or 0.0 for p in (start, full)]
    assert shape.prompt_tokens.mean == pytest.approx((sums[1] - sums[0]) / 16, abs=0.05)
    # queries grew, hits did not: a hit rate of 0, measured
    assert shape.prefix.hit_rate == 0.0 and shape.prefix.groups == ()
    assert shape.arrivals.concurrency == pytest.approx(2 / 3, abs=1e-3)  # 0, 2, 0 running
    assert shape.arrivals.burstiness is None
    assert shape.api == "completions"
    assert shape.source == f"metrics {URL} over 10 s (3 scrapes)"


def test_a_window_in_which_nothing_finished_is_refused() -> None:
    with pytest.raises(UsageError, match="no request finished in the 5 s window") as caught:
        shape_from_pages(
            [recorded("before", 0.0), recorded("during", 5.0)], url=URL, captured_at=CAPTURED_AT
        )
    assert "capture longer (--seconds) or while the engine serves traffic" in str(caught.value)


def test_built_pages_with_other_counts() -> None:
    old = [100] * 30 + [3000] * 10
    new = [100] * 10 + [900] * 20 + [3000] * 10
    pages = [
        page(vllm_page(prompts=old, hits=100, queries=1000, running=4), 0.0),
        page(vllm_page(prompts=old + new, hits=100 + 300, queries=1000 + 1000, running=6), 20.0),
    ]
    shape = shape_from_pages(pages, url=URL, captured_at=CAPTURED_AT)
    prompts = shape.prompt_tokens
    assert prompts.count == 40 and shape.arrivals.request_rate == 2.0
    assert (prompts.buckets["100"], prompts.buckets["1000"], prompts.buckets["5000"]) == (
        0.25,
        0.5,
        0.25,
    )
    assert math.fsum(prompts.buckets.values()) == pytest.approx(1.0)
    assert prompts.p50 == 750.0  # rank 20 of 40: the middle of (500, 1000]
    assert prompts.mean == pytest.approx((10 * 100 + 20 * 900 + 10 * 3000) / 40)
    assert shape.prefix.hit_rate == pytest.approx(0.3)
    assert shape.arrivals.concurrency == 5.0


@pytest.mark.parametrize(
    ("completions", "chats", "api"),
    [(40, 0, "completions"), (0, 40, "chat"), (30, 10, "unknown"), (0, 0, "unknown")],
)
def test_the_api_from_the_engine_http_counter(completions: int, chats: int, api: str) -> None:
    lengths = [100] * 40
    pages = [
        page(vllm_page(prompts=[], completions=0, chats=0), 0.0),
        page(vllm_page(prompts=lengths, completions=completions, chats=chats), 10.0),
    ]
    assert shape_from_pages(pages, url=URL, captured_at=CAPTURED_AT).api == api


def test_no_prefix_counters_no_hit_rate() -> None:
    text = [vllm_page(prompts=[100] * n) for n in (0, 10)]
    stripped = [
        "\n".join(x for x in t.splitlines() if "prefix_cache" not in x) + "\n" for t in text
    ]
    shape = shape_from_pages(
        [page(stripped[0], 0), page(stripped[1], 10)], url=URL, captured_at=CAPTURED_AT
    )
    assert shape.prefix.hit_rate is None


def test_a_restart_in_the_window_is_refused() -> None:
    pages = [
        page(vllm_page(prompts=[100] * 50), 0.0),
        page(vllm_page(prompts=[100] * 5), 10.0),  # the engine came back and counted anew
        page(vllm_page(prompts=[100] * 60), 20.0),
    ]
    with pytest.raises(ProbeError, match="fell from 50 to 5 at scrape 2: the engine restarted"):
        shape_from_pages(pages, url=URL, captured_at=CAPTURED_AT)


def test_a_page_without_the_length_histograms_is_refused() -> None:
    text = "\n".join(
        line
        for line in vllm_page(prompts=[100]).splitlines()
        if "request_prompt_tokens" not in line
    )
    with pytest.raises(ProbeError, match="exposes no vllm:request_prompt_tokens histogram"):
        shape_from_pages([page(text, 0), page(text, 10)], url=URL, captured_at=CAPTURED_AT)


async def test_capture_scrapes_over_the_window_and_reports_progress() -> None:
    clock = [0.0]
    finished = iter([0, 10, 25, 40, 40, 40])
    scrapes: list[float] = []

    async def scrape() -> Exposition:
        scrapes.append(clock[0])
        return page(vllm_page(prompts=[200] * next(finished), running=3), clock[0])

    async def sleep(seconds: float) -> None:
        assert 0 < seconds <= 4.0
        clock[0] += seconds

    seen: list[CaptureProgress] = []
    shape = await capture(
        scrape, url=URL, seconds=10.0, interval_s=4.0, on_progress=seen.append, sleep=sleep,
        now=lambda: CAPTURED_AT,
    )  # fmt: skip
    assert scrapes == [0.0, 4.0, 8.0, 10.0]  # the last sleep is cut to end on the window
    assert [(p.scrapes, p.finished, p.elapsed_s) for p in seen] == [
        (2, 10, 4.0),
        (3, 25, 8.0),
        (4, 40, 10.0),
    ]
    assert shape.prompt_tokens.count == 40 and shape.arrivals.request_rate == 4.0
    assert shape.captured_at == CAPTURED_AT and shape.source.endswith("over 10 s (4 scrapes)")


async def test_capture_refuses_a_zero_window() -> None:
    async def scrape() -> Exposition:
        raise AssertionError("no scrape for a window that cannot be")

    with pytest.raises(UsageError, match="longer than 0 s"):
        await capture(scrape, url=URL, seconds=0, interval_s=1)


def cli_capture(base_url: str, *args: str) -> tuple[int, str]:
    from bot.app.cli import cli

    result = CliRunner().invoke(
        cli,
        [
            "workload",
            "capture",
            "--metrics-url",
            f"{base_url}/metrics",
            "--interval",
            "0.05",
            *args,
        ],
    )
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def test_cli_capture_writes_the_shape(tmp_path: Path) -> None:
    pages = [(VLLM / "before.prom").read_text()] + [(VLLM / "after.prom").read_text()] * 50
    out = tmp_path / "prod.yaml"
    with RecordedMetrics(pages) as engine:
        code, output = cli_capture(engine.base_url, "--seconds", "0.2", "-o", str(out))
        assert engine.scrapes >= 2
    assert code == 0, output
    assert (
        f"wrote {out}" in output
        and "prompt tokens: p50 200–500, p90 200–500, p99 200–500 (16 requests" in output
    )
    shape = shapes.load(out)
    assert shape.prompt_tokens.count == 16 and shape.api == "completions"
    assert shape.source.startswith(f"metrics {engine.base_url}/metrics over ")


def test_cli_capture_without_traffic_exits_2(tmp_path: Path) -> None:
    pages = [(VLLM / "before.prom").read_text()] * 50
    with RecordedMetrics(pages) as engine:
        code, output = cli_capture(
            engine.base_url, "--seconds", "0.1", "-o", str(tmp_path / "s.json")
        )
    assert code == 2
    assert "no request finished" in output and "capture longer (--seconds)" in output
    assert not (tmp_path / "s.json").exists()


def test_cli_capture_refuses_a_wrong_suffix_before_scraping(tmp_path: Path) -> None:
    with RecordedMetrics([(VLLM / "before.prom").read_text()]) as engine:
        code, output = cli_capture(
            engine.base_url, "--seconds", "60", "-o", str(tmp_path / "s.txt")
        )
        assert engine.scrapes == 0
    assert code == 2 and "a shape file ends in .json, .yaml or .yml" in output


def test_cli_capture_of_a_page_that_is_not_vllm_exits_2(tmp_path: Path) -> None:
    with RecordedMetrics(["# TYPE up gauge\nup 1\n"]) as engine:
        code, output = cli_capture(
            engine.base_url, "--seconds", "0.1", "-o", str(tmp_path / "s.json")
        )
    assert code == 2 and "not a vLLM engine's" in output
