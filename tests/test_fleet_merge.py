"""A fleet's window from hand-built /metrics pages: histograms merged bucket by bucket, counters
summed, gauges as max (KV usage) or sum (requests), deltas only within one process, a restart
and a silent replica said, a URL answering from two engines refused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from bot.diagnosis.probes.context import ProbeContext, TargetRef
from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.fleet_window import Answer, FleetWindow, fleet_of
from bot.diagnosis.probes.queue_cancel import QueueCancelProbe
from bot.diagnosis.probes.replicas import Replica, replicas_of
from bot.diagnosis.probes.sampling import SAMPLED_METRICS
from bot.diagnosis.probes.vllm_metrics import Quantiles
from bot.diagnosis.probes.vllm_window import VllmMetricsProbe, WindowParams
from bot.kernel.config import Target
from bot.kernel.errors import EndpointError, ProbeError
from tests.fakes.clock import FakeTime

EDGES = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0)
A, B = Replica("http://a:8000"), Replica("http://b:8000")


def text(
    ttft: dict[float, int],
    *,
    started: float = 1000.0,
    finished: int = 0,
    running: int = 0,
    waiting: int = 0,
    kv: float = 0.0,
) -> str:
    """One engine's page: TTFT observations per bucket edge (not cumulative), a few gauges."""
    lines = [
        "# TYPE process_start_time_seconds gauge",
        f"process_start_time_seconds {started}",
        "# TYPE vllm:generation_tokens counter",
        f'vllm:generation_tokens_total{{engine="0"}} {10 * finished}',
        "# TYPE vllm:generation_tokens_created gauge",
        f'vllm:generation_tokens_created{{engine="0"}} {started + 5}',
        "# TYPE vllm:request_success counter",
        f'vllm:request_success_total{{engine="0"}} {finished}',
        "# TYPE vllm:num_requests_running gauge",
        f'vllm:num_requests_running{{engine="0"}} {running}',
        "# TYPE vllm:num_requests_waiting gauge",
        f'vllm:num_requests_waiting{{engine="0"}} {waiting}',
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f'vllm:kv_cache_usage_perc{{engine="0"}} {kv}',
        "# TYPE vllm:cache_config_info gauge",
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="101"} 1.0',
        "# TYPE vllm:time_to_first_token_seconds histogram",
    ]
    cumulative = 0
    for edge in EDGES:
        cumulative += ttft.get(edge, 0)
        lines.append(
            f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{edge}"}} {cumulative}'
        )
    lines += [
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf"}} {cumulative}',
        f'vllm:time_to_first_token_seconds_count{{engine="0"}} {cumulative}',
        f'vllm:time_to_first_token_seconds_sum{{engine="0"}} {cumulative * 0.1}',
    ]
    return "\n".join(lines) + "\n"


def page(ttft: dict[float, int], **kwargs: Any) -> Exposition:
    """The page as a scrape parses it."""
    return Exposition.parse(text(ttft, **kwargs), at=0.0, only=SAMPLED_METRICS)


def window(a: Sequence[Answer], b: Sequence[Answer]) -> FleetWindow:
    times = [float(k) for k in range(len(a))]
    return fleet_of([A, B], [list(pair) for pair in zip(a, b, strict=True)], times)


def test_two_replicas_histograms_merge_bucket_by_bucket() -> None:
    fast = [page({0.01: 5}), page({0.01: 5, 0.05: 90}, finished=90)]
    slow = [page({}, started=2000), page({0.5: 3, 5.0: 7}, started=2000, finished=10)]
    fleet = window(fast, slow)
    merged = fleet.window.pages
    # bucket by bucket, the sum of the two replicas' deltas
    alone = [
        Quantiles.from_histogram(p[0], p[1], ("vllm:time_to_first_token_seconds",))
        for p in (fast, slow)
    ]
    both = fleet.window.engine.ttft_ms
    assert both.count == alone[0].count + alone[1].count == 100
    b0, b1 = (
        merged[0].buckets("vllm:time_to_first_token_seconds"),
        merged[1].buckets("vllm:time_to_first_token_seconds"),
    )
    assert {le: b1[le] - b0[le] for le in b1} == {
        0.01: 0, 0.05: 90, 0.1: 90, 0.5: 93, 1.0: 93, 5.0: 100, float("inf"): 100
    }  # fmt: skip
    assert fleet.window.engine.requests_finished == 100
    # the fleet's p99 is the merged histogram's, not an average of the two p99s
    assert both.p99 is not None and both.p99 > 1000
    assert alone[0].p99 is not None and alone[0].p99 < 50
    summaries = fleet.details()["replicas"]
    assert isinstance(summaries, dict)
    assert summaries["a:8000"]["ttft_p99_ms"] < summaries["b:8000"]["ttft_p99_ms"]
    assert summaries["b:8000"]["requests_finished"] == 10


def test_gauges_take_the_fullest_kv_and_sum_requests() -> None:
    a = [page({}), page({}, running=3, waiting=1, kv=0.2)]
    b = [page({}, started=2000), page({}, started=2000, running=4, waiting=2, kv=0.6)]
    fleet = window(a, b)
    point = fleet.window.points[-1]
    assert point.kv_cache_usage == pytest.approx(0.6)  # the fullest replica, not 0.8
    assert point.requests_running == 7 and point.requests_waiting == 3
    assert fleet.window.engine.kv_cache_usage == pytest.approx(0.6)


def test_a_restart_inside_the_window_is_said_not_clamped() -> None:
    # b restarts between rounds 1 and 2: its counters start again from zero
    a = [page({}), page({0.01: 10}, finished=10), page({0.01: 20}, finished=20)]
    b = [
        page({0.05: 50}, started=2000, finished=50),
        page({0.05: 60}, started=2000, finished=60),
        page({0.05: 4}, started=3000, finished=4),
    ]
    fleet = window(a, b)
    # a: 20; b's old process: 10; b's new one: nothing after its first page
    assert fleet.window.engine.requests_finished == 30
    assert fleet.window.engine.ttft_ms.count == 30
    summary = fleet.details()["replicas"]["b:8000"]  # type: ignore[index]
    assert "restarted inside the window" in summary["note"]
    assert summary["requests_finished"] == 10


def test_a_replica_that_stops_answering_is_said_and_its_work_counted_once() -> None:
    down = EndpointError("cannot scrape http://b:8000/metrics: connection refused")
    a = [page({}), page({0.01: 10}, finished=10), page({0.01: 20}, finished=20)]
    b: list[Answer] = [
        page({}, started=2000),
        page({0.05: 5}, started=2000, finished=5, running=2),
        down,
    ]
    fleet = window(a, b)
    assert fleet.window.engine.requests_finished == 25
    assert fleet.window.points[-1].requests_running == 0  # b's last queue is not carried on
    note = fleet.details()["replicas"]["b:8000"]["note"]  # type: ignore[index]
    assert "answered 2 of 3 scrapes" in note and "connection refused" in note


def test_one_url_answering_from_two_engines_is_refused() -> None:
    one, two = page({}), page({}, started=2000)
    with pytest.raises(
        ProbeError, match="answers from 2 engines; list the replicas|answers from 2"
    ):
        fleet_of([A], [[one], [two], [one]], [0.0, 1.0, 2.0])
    # two URLs of the same engine would count its work twice
    with pytest.raises(ProbeError, match="answer from the same engine"):
        fleet_of([A, B], [[one, one], [one, one]], [0.0, 1.0])


def test_a_fleet_of_one_reads_its_pages_as_scraped() -> None:
    pages = [page({}), page({0.01: 3}, finished=3)]
    fleet = fleet_of([A], [[p] for p in pages], [0.0, 1.0])
    assert list(fleet.window.pages) == pages and fleet.details() == {}


def test_replicas_config_and_the_fleet_of_one() -> None:
    assert replicas_of(Target(vllm_url="http://svc:8000")) == [Replica("http://svc:8000")]
    target = Target(vllm_url="http://svc:8000", replicas=["http://u:p@a:8000/", "http://b:8000"])
    assert [r.address for r in replicas_of(target)] == ["a:8000", "b:8000"]
    with pytest.raises(ValueError, match="not an http"):
        Target(vllm_url="http://svc:8000", replicas=["a:8000"])


def context(served: dict[str, list[str]]) -> ProbeContext:
    """Each host answers its pages in order, repeating the last."""

    def handler(request: httpx.Request) -> httpx.Response:
        pages = served[request.url.host]
        return httpx.Response(200, text=pages.pop(0) if len(pages) > 1 else pages[0])

    time = FakeTime()
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return ProbeContext(http=http, monotonic=time.clock, sleep=time.sleep)


async def test_probes_read_the_fleet() -> None:
    ctx = context({"a": [text({}), text({0.01: 9}, finished=9)], "b": [text({}, started=2000)]})
    fleet = TargetRef("f", Target(vllm_url="http://svc:8000", replicas=[A.url, B.url]))
    result = await VllmMetricsProbe().run(target=fleet, params=WindowParams(window_s=1), ctx=ctx)
    assert result.readings.value("requests_finished") == 9
    assert set(result.details["replicas"]) == {"a:8000", "b:8000"}
    queue = await QueueCancelProbe().run(target=fleet, params=WindowParams(window_s=1), ctx=ctx)
    assert "replicas" in queue.details


async def test_the_probe_refuses_a_url_that_answers_from_two_engines() -> None:
    one, two = text({}), text({}, started=2000)
    ctx = context({"svc": [one, two, one]})
    target = TargetRef("f", Target(vllm_url="http://svc:8000"))
    params = WindowParams(window_s=2, interval_s=1)
    with pytest.raises(ProbeError, match=r"http://svc:8000 answers from 2 engines.*replicas = "):
        await VllmMetricsProbe().run(target=target, params=params, ctx=ctx)
