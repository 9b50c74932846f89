"""The vLLM metrics probe on /metrics pages captured from the real engine."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.vllm_metrics import (
    KV_USAGE,
    RUNNING,
    CacheConfig,
    MetricsScraper,
    cache_config,
    gauge,
    parse_page,
    read_window,
)
from bot.kernel.errors import EndpointError, ProbeError
from bot.kernel.numbers.histogram import histogram_quantile
from tests.conftest import FIXTURES


def load(version: str, name: str, at: float) -> Exposition:
    return Exposition.parse((FIXTURES / version / f"{name}.prom").read_text(), at=at)


@pytest.fixture(params=["vllm-0.32.0", "vllm-older-names"])
def window(request: pytest.FixtureRequest):
    return read_window(load(request.param, "before", 0.0), load(request.param, "after", 4.0))


def test_window_counts_tokens_and_requests_between_scrapes(window) -> None:
    assert window.generation_tokens == 772
    assert window.finished_generation_tokens == 768
    assert window.prompt_tokens == 3592
    assert window.requests_finished == 16
    assert window.generation_tokens_per_s == pytest.approx(772 / 4.0)


def test_window_goodput_and_wasted_prefill_follow_design_definition(window) -> None:
    assert window.goodput_ratio == pytest.approx(768 / 772)
    assert window.wasted_prefill_tokens == 200


def test_window_reads_latency_histograms_as_deltas(window) -> None:
    assert window.ttft_ms.count == 17  # 16 finished + 1 aborted after its first token
    assert window.e2e_ms.count == 16
    assert window.itl_ms.count > 0  # under either name
    for q in (window.ttft_ms, window.itl_ms, window.e2e_ms):
        assert q.p50 is not None and q.p99 is not None and q.mean is not None
        assert 0 < q.p50 <= q.p90 <= q.p99


def test_window_reads_cache_geometry_from_cache_config_info(window) -> None:
    assert window.cache == CacheConfig(block_size=128, num_gpu_blocks=8192)


def test_window_reads_kv_usage_under_old_and_new_names() -> None:
    for version in ("vllm-0.32.0", "vllm-older-names"):
        assert gauge(load(version, "after", 0), KV_USAGE) == 0.0


def test_during_scrape_shows_requests_in_flight() -> None:
    during = load("vllm-0.32.0", "during", 0.3)
    assert gauge(during, RUNNING) == 2
    assert gauge(during, KV_USAGE) == pytest.approx(4 / 8191)  # vLLM: used / (blocks - null block)


def test_prefix_cache_hit_rate_is_none_without_counters_or_gauge() -> None:
    old = read_window(load("vllm-older-names", "before", 0), load("vllm-older-names", "after", 1))
    assert old.prefix_cache_hit_rate is None
    new = read_window(load("vllm-0.32.0", "before", 0), load("vllm-0.32.0", "after", 1))
    assert new.prefix_cache_hit_rate is not None and 0 <= new.prefix_cache_hit_rate <= 1


def test_counter_reset_never_reports_negative_work() -> None:
    after, before = load("vllm-0.32.0", "before", 1), load("vllm-0.32.0", "after", 0)
    window = read_window(before, after)  # "after" is older: as if the engine restarted
    assert window.generation_tokens == 0


def test_empty_window_has_no_quantiles() -> None:
    page = load("vllm-0.32.0", "after", 0)
    window = read_window(page, page)
    assert window.ttft_ms.p99 is None and window.ttft_ms.count == 0
    assert window.goodput_ratio is None


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        (0.5, {0.1: 0, 0.2: 10, float("inf"): 10}, 0.15),
        (0.99, {0.1: 5, 0.2: 10, float("inf"): 10}, 0.198),
        (0.5, {0.1: 0, float("inf"): 4}, 0.1),  # in +Inf: largest finite bound
        (0.5, {0.1: 0, 0.2: 0, float("inf"): 0}, None),
        (0.5, {}, None),
    ],
)
def test_histogram_quantile_interpolates_like_prometheus(q, buckets, expected) -> None:
    assert histogram_quantile(q, buckets) == (None if expected is None else pytest.approx(expected))


def test_cache_config_absent_or_malformed_is_none() -> None:
    page = Exposition.parse('vllm:cache_config_info{block_size="x"} 1\n', at=0)
    assert cache_config(page) is None


def test_parse_page_refuses_a_page_that_is_not_vllms() -> None:
    with pytest.raises(ProbeError, match="not a vLLM engine's"):
        parse_page("# TYPE up gauge\nup 1\n", url="http://x/metrics", at=0)


def test_parse_page_refuses_text_that_is_not_an_exposition() -> None:
    with pytest.raises(ProbeError, match="not a Prometheus metrics page"):
        parse_page("<html><body>hello</body></html>", url="http://x/metrics", at=0)


async def test_scraper_reads_through_injected_transport() -> None:
    text = (FIXTURES / "vllm-0.32.0" / "after.prom").read_text()
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=text))
    async with httpx.AsyncClient(transport=transport) as client:
        page = await MetricsScraper("http://engine/metrics", client=client, clock=lambda: 42.0)()
    assert page.at == 42.0 and gauge(page, RUNNING) == 0


@pytest.mark.parametrize(
    ("response", "error", "message"),
    [
        (httpx.Response(404, text="nope"), ProbeError, "HTTP 404"),
        (httpx.Response(200, text="up 1\n"), ProbeError, "not a vLLM"),
    ],
)
async def test_scraper_errors_say_what_is_wrong(response, error, message) -> None:
    transport = httpx.MockTransport(lambda request: response)
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(error, match=message):
            await MetricsScraper("http://engine/metrics", client=client)()


async def test_scraper_unreachable_is_an_endpoint_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
        with pytest.raises(EndpointError, match="cannot scrape http://engine/metrics"):
            await MetricsScraper("http://engine/metrics", client=client)()


def test_parsing_only_window_metrics_reads_the_same_window() -> None:
    from bot.diagnosis.probes.vllm_metrics import WINDOW_METRICS

    def page(name: str, at: float, only=None) -> Exposition:
        text = (FIXTURES / "vllm-0.32.0" / f"{name}.prom").read_text()
        return Exposition.parse(text, at=at, only=only)

    full = read_window(page("before", 0), page("after", 4))
    lean = read_window(page("before", 0, WINDOW_METRICS), page("after", 4, WINDOW_METRICS))
    assert lean == full
    assert len(page("after", 4, WINDOW_METRICS).samples) < len(page("after", 4).samples)


async def serve_then_drop_kept_connections(page: str) -> tuple[asyncio.Server, list[int]]:
    """A metrics server that answers each connection's first request with keep-alive and
    closes it, unanswered, on the second: what a uvicorn engine does when its keep-alive
    timeout fires just as a pooled connection is reused. Counts requests per connection."""
    body = page.encode()
    head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\ncontent-type: text/plain\r\n\r\n"
    served: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(head.encode() + body)
            await writer.drain()
            served.append(1)
            await reader.readuntil(b"\r\n\r\n")  # the reuse: drop it, as the timeout would
        except asyncio.IncompleteReadError:
            pass  # the client closed this connection first
        finally:
            writer.close()
            await writer.wait_closed()

    return await asyncio.start_server(handle, "127.0.0.1", 0), served


async def test_scraper_asks_again_when_a_kept_connection_was_closed_under_it() -> None:
    text = (FIXTURES / "vllm-0.32.0" / "after.prom").read_text()
    server, served = await serve_then_drop_kept_connections(text)
    port = server.sockets[0].getsockname()[1]
    async with server, httpx.AsyncClient(timeout=5) as client:
        scrape = MetricsScraper(f"http://127.0.0.1:{port}/metrics", client=client)
        await scrape()
        page = await scrape()  # reuses the kept connection, which the server drops
    assert gauge(page, RUNNING) == 0 and len(served) == 2  # answered on a second connection
