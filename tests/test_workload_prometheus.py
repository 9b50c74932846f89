"""Capturing a shape from a real Prometheus holding an engine's history (backfilled blocks).

Three engines' vLLM series over the two hours before END, one sample a minute, counters
growing by the same requests every minute (so ``increase()`` over whole minutes is exact):

- A (10.0.0.5:8000): each minute 3 prompts of 100 tokens and 1 of 3000, outputs 40 and 300;
  prefix cache 300 hits of 1000 queried tokens; 4 running; completions;
- B (10.0.0.9:8000): each minute 2 prompts of 900 tokens; restarts (its counters fall to what
  the minute after the restart finished) half an hour before END;
- C (10.0.0.7:8000): an engine without the length histograms (only the running gauge);
- D (10.0.0.8:8000): an idle engine: its histograms hold 10 requests and never grow;
- E (10.0.0.6:8000): A's traffic, its bucket edges written as integers (le="100", not "100.0").

The same shape builder as a capture of pages: the window reads as the pages' deltas would.
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from bot.adr.workload import shape as shapes
from bot.diagnosis.probes.prometheus_capture import capture_from_prometheus, matchers, parse_since
from bot.diagnosis.probes.vllm_metrics import parse_page
from bot.diagnosis.probes.workload_capture import CAPTURE_METRICS, shape_from_pages
from bot.engine.process import free_port
from bot.kernel.errors import EndpointError, ProbeError, UsageError
from tests.fakes.prometheus_history import openmetrics, prometheus_with
from tests.workload_pages import CAPTURED_AT, VLLM_EDGES, vllm_page

END = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC).timestamp()
MINUTES = 120
A = (("instance", "10.0.0.5:8000"), ("job", "vllm"), ("model_name", "tiny-llama"))
B = (("instance", "10.0.0.9:8000"), ("job", "vllm"), ("model_name", "tiny-llama"))
C = (("instance", "10.0.0.7:8000"), ("job", "vllm-old"))
D = (("instance", "10.0.0.8:8000"), ("job", "vllm-idle"))
E = (("instance", "10.0.0.6:8000"), ("job", "vllm-int"))
A_PROMPTS, A_OUTPUTS = [100, 100, 100, 3000], [40, 40, 40, 300]
B_PROMPTS, B_OUTPUTS = [900, 900], [16, 16]
RESTART = 90  # B's minute of restart (END - 30 min)

Series = dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]]


def _histogram(series: Series, name: str, labels: tuple[tuple[str, str], ...],
               per_minute: list[int], counts: list[int], *, as_int: bool = False) -> None:  # fmt: skip
    """Cumulative buckets of ``name`` after ``counts[i]`` minutes' worth of ``per_minute``."""
    times = [END - (MINUTES - i) * 60 for i in range(MINUTES + 1)]
    for edge in [*VLLM_EDGES, float("inf")]:
        le = "+Inf" if edge == float("inf") else f"{int(edge) if as_int else float(edge)}"
        inside = sum(1 for v in per_minute if v <= edge)
        series[(f"{name}_bucket", (*labels, ("le", le)))] = [
            (t, float(inside * n)) for t, n in zip(times, counts, strict=True)
        ]
    series[(f"{name}_count", labels)] = [
        (t, float(len(per_minute) * n)) for t, n in zip(times, counts, strict=True)
    ]
    series[(f"{name}_sum", labels)] = [
        (t, float(sum(per_minute) * n)) for t, n in zip(times, counts, strict=True)
    ]


def history() -> str:
    times = [END - (MINUTES - i) * 60 for i in range(MINUTES + 1)]
    steady = list(range(MINUTES + 1))
    restarted = [i if i < RESTART else i - RESTART + 1 for i in steady]
    series: Series = {}
    _histogram(series, "vllm:request_prompt_tokens", A, A_PROMPTS, steady)
    _histogram(series, "vllm:request_generation_tokens", A, A_OUTPUTS, steady)
    _histogram(series, "vllm:request_prompt_tokens", B, B_PROMPTS, restarted)
    _histogram(series, "vllm:request_generation_tokens", B, B_OUTPUTS, restarted)
    _histogram(series, "vllm:request_prompt_tokens", E, A_PROMPTS, steady, as_int=True)
    _histogram(series, "vllm:request_generation_tokens", E, A_OUTPUTS, steady, as_int=True)
    _histogram(series, "vllm:request_prompt_tokens", D, [100] * 10, [1] * (MINUTES + 1))
    _histogram(series, "vllm:request_generation_tokens", D, [16] * 10, [1] * (MINUTES + 1))
    counted = list(zip(times, steady, strict=True))
    series[("vllm:prefix_cache_hits_total", A)] = [(t, 300.0 * i) for t, i in counted]
    series[("vllm:prefix_cache_queries_total", A)] = [(t, 1000.0 * i) for t, i in counted]
    series[("vllm:request_success_total", A)] = [(t, 4.0 * i) for t, i in counted]
    for engine, running in ((A, 4.0), (B, 1.0), (C, 2.0)):
        series[("vllm:num_requests_running", engine)] = [(t, running) for t in times]
    for handler, method, per_minute in (
        ("/v1/completions", "POST", 4.0),
        ("/v1/models", "GET", 50.0),
    ):
        labels = (("handler", handler), *A, ("method", method), ("status", "2xx"))
        series[("http_requests_total", labels)] = [(t, per_minute * i) for t, i in counted]
    return openmetrics(series)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (`make test` installs it)")
    with prometheus_with(history(), tmp_path_factory.mktemp("prom")) as url:
        yield url


async def capture(url: str, selector: str, *, minutes: float = 60, end: float = END):
    async with httpx.AsyncClient(timeout=30) as client:
        return await capture_from_prometheus(
            client, url, selector=selector, seconds=minutes * 60, end=end
        )


async def test_an_hour_of_one_engine(prometheus: str) -> None:
    shape = await capture(prometheus, '{instance="10.0.0.5:8000"}')
    prompts, outputs = shape.prompt_tokens, shape.output_tokens
    assert prompts.count == outputs.count == 240  # 4 a minute for 60 minutes, not B's
    assert (prompts.buckets["100"], prompts.buckets["5000"]) == (0.75, 0.25)
    assert (outputs.buckets["50"], outputs.buckets["500"]) == (0.75, 0.25)
    assert sum(1 for share in prompts.buckets.values() if share) == 2
    assert prompts.mean == pytest.approx((3 * 100 + 3000) / 4)
    assert shape.arrivals.request_rate == pytest.approx(240 / 3600, abs=1e-4)
    assert shape.arrivals.concurrency == 4.0 and shape.arrivals.burstiness is None
    assert shape.prefix.hit_rate == pytest.approx(0.3) and shape.prefix.groups == ()
    assert shape.api == "completions"
    assert shape.captured_at.timestamp() == END
    assert shape.source == (
        f'prometheus {prometheus} {{instance="10.0.0.5:8000"}} over 3600 s to 2026-11-30T12:00:00Z'
    )


async def test_the_same_window_from_pages_gives_the_same_shape(prometheus: str) -> None:
    """One builder, two sources: the pages an engine showed at the window's edges."""
    before = [p for _ in range(60) for p in A_PROMPTS]
    during = [p for _ in range(60) for p in A_PROMPTS]
    outputs = [o for _ in range(120) for o in A_OUTPUTS]
    pages = [
        parse_page(vllm_page(prompts=before, outputs=outputs[:240], running=4, hits=300 * 60,
                             queries=1000 * 60), url="x", at=0.0, only=CAPTURE_METRICS),
        parse_page(vllm_page(prompts=before + during, outputs=outputs, running=4,
                             hits=300 * 120, queries=1000 * 120), url="x", at=3600.0,
                   only=CAPTURE_METRICS),
    ]  # fmt: skip
    from_pages = shape_from_pages(pages, url="x", captured_at=CAPTURED_AT)
    from_prometheus = await capture(prometheus, '{instance="10.0.0.5:8000"}')
    keep = {"source", "captured_at"}
    assert from_pages.model_dump(exclude=keep) == from_prometheus.model_dump(exclude=keep)


async def test_a_restart_in_the_window_is_read_across(prometheus: str) -> None:
    """increase() adds up across a counter reset: B's hour holds 60 minutes of requests."""
    shape = await capture(prometheus, '{instance="10.0.0.9:8000"}')
    assert shape.prompt_tokens.count == 120 and shape.prompt_tokens.buckets["1000"] == 1.0
    assert shape.prefix.hit_rate is None and shape.arrivals.concurrency == 1.0
    assert shape.api == "unknown"  # no HTTP counter in B's history


async def test_a_selector_over_two_engines_sums_them(prometheus: str) -> None:
    shape = await capture(prometheus, '{job="vllm"}', minutes=10)
    assert shape.prompt_tokens.count == 10 * (4 + 2)
    assert shape.arrivals.concurrency == 5.0


async def test_edges_written_two_ways_are_one_edge(prometheus: str) -> None:
    shape = await capture(prometheus, '{instance=~"10.0.0.[56]:8000"}')
    assert shape.prompt_tokens.count == 480
    assert (shape.prompt_tokens.buckets["100"], shape.prompt_tokens.buckets["5000"]) == (0.75, 0.25)
    assert len(shape.prompt_tokens.buckets) == 14


async def test_no_data_for_the_selector_is_a_clear_error(prometheus: str) -> None:
    with pytest.raises(ProbeError) as caught:
        await capture(prometheus, '{instance="10.0.0.99:8000"}')
    message = str(caught.value)
    assert 'holds no vLLM series matching {instance="10.0.0.99:8000"}' in message
    assert 'instance="10.0.0.5:8000"' in message  # the engines it does hold are named
    # a window before the history began: the same, naming the window
    with pytest.raises(ProbeError, match="between 2026-11-29T09:00:00Z and 2026-11-29T10:00:00Z"):
        await capture(prometheus, '{instance="10.0.0.5:8000"}', end=END - 86400 - 7200)


async def test_an_engine_without_the_histograms_is_refused(prometheus: str) -> None:
    with pytest.raises(ProbeError, match="holds no vllm:request_prompt_tokens histogram"):
        await capture(prometheus, '{instance="10.0.0.7:8000"}')


async def test_a_window_in_which_nothing_finished_is_refused(prometheus: str) -> None:
    with pytest.raises(UsageError, match="no request finished in the 3600 s window at ") as caught:
        await capture(prometheus, '{instance="10.0.0.8:8000"}')
    assert "capture longer (--since) or while the engine serves traffic" in str(caught.value)


async def test_a_prometheus_that_is_down_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EndpointError, match=f"cannot reach Prometheus at {url}"):
        await capture(url, '{instance="10.0.0.5:8000"}')


def test_selectors_and_windows_are_checked() -> None:
    assert matchers('{job="vllm", instance="a:1",}') == 'job="vllm", instance="a:1"'
    with pytest.raises(UsageError, match="must be label matchers in braces"):
        matchers('instance="a:1"')
    assert parse_since("1h") == 3600 and parse_since("90m") == 5400 and parse_since("600") == 600
    with pytest.raises(UsageError, match="is not a duration"):
        parse_since("an hour")
    with pytest.raises(UsageError, match="shorter than 60 s"):
        parse_since("10s")


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    from bot.app.cli import cli as main

    result = CliRunner().invoke(main, ["workload", "capture", *args], env=env)
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def test_cli_by_selector_and_by_target(prometheus: str, tmp_path: Path) -> None:
    out = tmp_path / "a.yaml"
    code, output = cli("--prometheus", prometheus, "--selector", '{instance="10.0.0.5:8000"}',
                       "--since", "1h", "--until", "2026-11-30T12:00:00Z", "-o", str(out))  # fmt: skip
    assert code == 0, output
    assert "prompt tokens: " in output and "(240 requests" in output
    by_selector = shapes.load(out)
    config = tmp_path / "ruleloop.toml"
    config.write_text('[targets.prod-a]\nvllm_url = "http://10.0.0.5:8000"\n')
    code, output = cli("--prometheus", prometheus, "--target", "prod-a", "--config", str(config),
                       "--since", "60m", "--until", str(END), "-o", str(tmp_path / "b.json"))  # fmt: skip
    assert code == 0, output
    assert shapes.load(tmp_path / "b.json") == by_selector
    code, output = cli("--prometheus", prometheus, "--target", "prod-b", "--config", str(config),
                       "--since", "1h", "-o", str(tmp_path / "c.json"))  # fmt: skip
    assert code == 2 and "unknown target 'prod-b'; known targets: prod-a" in output


def test_cli_no_data_exits_2_naming_the_selector(prometheus: str, tmp_path: Path) -> None:
    code, output = cli("--prometheus", prometheus, "--selector", '{instance="nope:1"}',
                       "--since", "1h", "--until", str(END), "-o", str(tmp_path / "s.json"))  # fmt: skip
    assert code == 2 and '{instance="nope:1"}' in output and "holds no vLLM series" in output
    assert not (tmp_path / "s.json").exists()


def test_cli_prometheus_down_exits_2(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, output = cli("--prometheus", url, "--selector", '{job="vllm"}', "--since", "1h",
                       "-o", str(tmp_path / "s.json"))  # fmt: skip
    assert code == 2 and f"cannot reach Prometheus at {url}" in output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metrics-url", "http://e/metrics", "--prometheus", "http://p", "--seconds", "1"],
         "give exactly one source: --metrics-url (scrape now), --prometheus (its history) or "
         "--gateway (its request records); got --metrics-url and --prometheus"),
        ([], "give exactly one source"),
        (["--prometheus", "http://p", "--seconds", "60", "--selector", "{}"],
         "--seconds belongs to --metrics-url, not to --prometheus"),
        (["--prometheus", "http://p", "--since", "1h"], "--target NAME (a configured target)"),
        (["--prometheus", "http://p", "--selector", "{}"], "--prometheus needs --since"),
        (["--prometheus", "http://p", "--since", "1h", "--selector", "job=x"],
         "must be label matchers in braces"),
        (["--metrics-url", "http://e/metrics"], "--metrics-url needs --seconds"),
        (["--gateway", "http://g", "--selector", "{}"], "--selector belongs to --prometheus"),
    ],
)  # fmt: skip
def test_cli_usage_errors(args: list[str], message: str, tmp_path: Path) -> None:
    code, output = cli(*args, "-o", str(tmp_path / "s.json"))
    assert code == 2 and message in " ".join(output.split()), output


def test_cli_help_teaches_the_three_sources() -> None:
    from bot.app.cli import cli as main

    text = CliRunner().invoke(main, ["workload", "capture", "--help"]).output
    for flag in ("--metrics-url", "--prometheus", "--gateway", "--since", "--selector",
                 "--target", "--token-file", "exactly one"):  # fmt: skip
        assert flag in text
    assert "ruleloop workload capture --prometheus http://prometheus:9090 --target" in text


def test_a_password_in_the_prometheus_url_is_never_shown(prometheus: str, tmp_path: Path) -> None:
    # it was printed and written into the shape's source, which goes into ADR front matter
    url = prometheus.replace("http://", "http://ruleloop:s3cret-pass@")
    out = tmp_path / "a.yaml"
    code, output = cli("--prometheus", url, "--selector", '{instance="10.0.0.5:8000"}',
                       "--since", "1h", "--until", str(END), "-o", str(out))  # fmt: skip
    assert code == 0, output
    assert "s3cret" not in output + out.read_text()
    assert shapes.load(out).source.startswith("prometheus http://***@127.0.0.1:")
    code, output = cli("--prometheus", url, "--selector", '{instance="nope:1"}',
                       "--since", "1h", "--until", str(END), "-o", str(out))  # fmt: skip
    assert code == 2 and "holds no vLLM series" in output and "s3cret" not in output
    down = f"http://ruleloop:s3cret-pass@127.0.0.1:{free_port()}"
    code, output = cli("--prometheus", down, "--selector", '{job="vllm"}', "--since", "1h",
                       "-o", str(out))  # fmt: skip
    assert code == 2 and "cannot reach Prometheus at http://***@127.0.0.1:" in output
    assert "s3cret" not in output
