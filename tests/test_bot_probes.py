"""The bot's probes on recorded readings: vLLM window, queue/cancel, NVML (fake module), PromQL."""

from __future__ import annotations

import json

import httpx
import pytest

from bot.diagnosis.probes.context import ProbeContext, TargetRef
from bot.diagnosis.probes.nvml import NvmlParams, NvmlProbe
from bot.diagnosis.probes.prometheus import PrometheusParams, PrometheusProbe
from bot.diagnosis.probes.queue_cancel import QueueCancelProbe
from bot.diagnosis.probes.types import Severity
from bot.diagnosis.probes.vllm_window import VllmMetricsProbe, WindowParams
from bot.gateway.budget import TokenBudget
from bot.gateway.metrics import GatewayMetrics, RelayOutcome
from bot.kernel.config import Target
from bot.kernel.errors import EndpointError, ProbeError
from tests.conftest import FIXTURES
from tests.fakes.clock import FakeTime
from tests.fakes.nvml import FakeNvml

VLLM = FIXTURES / "vllm-0.32.0"
PAGES = [(VLLM / f"{name}.prom").read_text() for name in ("before", "during", "after")]
TARGET = TargetRef("prod-a", Target(vllm_url="http://engine:8000", gateway_url="http://gw:9000"))


def serve(routes: dict[str, list[str]]) -> httpx.MockTransport:
    """Each path answers its pages in order, repeating the last."""
    served: dict[str, list[str]] = {path: list(pages) for path, pages in routes.items()}

    def handler(request: httpx.Request) -> httpx.Response:
        key = f"{request.url.host}{request.url.path}"
        pages = served.get(key)
        if pages is None:
            return httpx.Response(404, text="not found")
        text = pages.pop(0) if len(pages) > 1 else pages[0]
        return httpx.Response(200, text=text)

    return httpx.MockTransport(handler)


def context(transport: httpx.MockTransport, **kwargs: object) -> tuple[ProbeContext, FakeTime]:
    time = FakeTime()
    http = httpx.AsyncClient(transport=transport)
    return ProbeContext(http=http, monotonic=time.clock, sleep=time.sleep, **kwargs), time  # type: ignore[arg-type]


async def test_vllm_metrics_window_reads_the_four_numbers() -> None:
    ctx, time = context(serve({"engine/metrics": PAGES}))
    result = await VllmMetricsProbe().run(
        target=TARGET, params=WindowParams(window_s=2, interval_s=1), ctx=ctx
    )
    r = result.readings.numbers
    assert time.slept == [1, 1]
    assert r["goodput_ratio"] == pytest.approx(768 / 772)
    assert r["ttft_p99_ms"] is not None and r["ttft_p99_ms"] > 0
    assert r["tpot_p99_ms"] is not None and r["tpot_p99_ms"] > 0
    assert r["requests_finished"] == 16
    # the `during` page saw requests in flight with KV blocks in use
    assert r["requests_running"] and r["kv_cache_usage"]
    assert r["kv_fragmentation"] is not None and 0 <= r["kv_fragmentation"] < 1
    # the window it read is part of its result (the chart draws it)
    assert result.window is not None and [round(p.t) for p in result.window.points] == [1, 2]


async def test_probes_share_one_window() -> None:
    scrapes: list[str] = []
    pages = list(PAGES)

    def handler(request: httpx.Request) -> httpx.Response:
        scrapes.append(request.url.path)
        return httpx.Response(200, text=pages.pop(0) if len(pages) > 1 else pages[0])

    ctx, _ = context(httpx.MockTransport(handler))
    target = TargetRef("a", Target(vllm_url="http://engine:8000"))
    params = WindowParams(window_s=2, interval_s=1)
    import asyncio

    a, b = await asyncio.gather(
        VllmMetricsProbe().run(target=target, params=params, ctx=ctx),
        QueueCancelProbe().run(target=target, params=params, ctx=ctx),
    )
    assert len(scrapes) == 3
    assert a.readings.value("requests_waiting") == b.readings.value("requests_waiting")


def _gateway_page(ok: int, cancelled: int, deadline: int, rejected: int) -> str:
    metrics = GatewayMetrics(TokenBudget())
    for outcome, n in (
        (RelayOutcome.OK, ok),
        (RelayOutcome.CLIENT_CANCEL, cancelled),
        (RelayOutcome.DEADLINE, deadline),
    ):
        for _ in range(n):
            metrics.admitted(100)
            metrics.finished(outcome, prompt_tokens=100, output_tokens=10, ttft_s=0.1, tpot_s=0.01)
    for _ in range(rejected):
        metrics.refused(RelayOutcome.REJECTED)
    return metrics.exposition().decode()


async def test_queue_cancel_engine_and_gateway() -> None:
    gateway = [_gateway_page(2, 0, 0, 0), _gateway_page(8, 3, 1, 5)]
    ctx, _ = context(serve({"engine/metrics": PAGES, "gw/metrics": gateway}))
    result = await QueueCancelProbe().run(
        target=TARGET, params=WindowParams(window_s=2, interval_s=1), ctx=ctx
    )
    r = result.readings.numbers
    assert r["wasted_prefill_tokens"] == 200 and r["wasted_prefill_share"] == pytest.approx(
        200 / 3592
    )
    assert r["wasted_decode_tokens"] == 4
    assert r["cancelled_share"] == pytest.approx(4 / 10)  # (3 cancelled + 1 deadline) / 10 admitted
    assert r["gateway_wasted_output_tokens"] == 40 and r["gateway_rejected"] == 5
    assert r["queue_time_p99_ms"] is not None


async def test_queue_cancel_without_gateway_reads_none_there() -> None:
    ctx, _ = context(serve({"engine/metrics": PAGES}))
    target = TargetRef("a", Target(vllm_url="http://engine:8000"))
    result = await QueueCancelProbe().run(target=target, params=WindowParams(window_s=1), ctx=ctx)
    assert result.readings.value("cancelled_share") is None
    assert result.readings.value("wasted_prefill_tokens") is not None


async def test_vllm_window_refuses_a_non_vllm_page() -> None:
    ctx, _ = context(serve({"engine/metrics": ["# TYPE up gauge\nup 1\n"]}))
    with pytest.raises(ProbeError, match="not a vLLM engine's"):
        await VllmMetricsProbe().run(target=TARGET, params=WindowParams(window_s=1), ctx=ctx)


async def test_nvml_reads_every_gpu() -> None:
    fake = FakeNvml.from_file(FIXTURES / "nvml" / "h200-x2.json")
    ctx, _ = context(serve({}), nvml=fake, hostname="gpu-host")
    result = await NvmlProbe().run(target=TARGET, params=NvmlParams(), ctx=ctx)
    r = result.readings.numbers
    assert r["gpu_count"] == 2 and r["utilization_pct"] == 100 and r["temperature_c"] == 83
    assert r["memory_used_ratio"] == pytest.approx(146028888064 / 150754820096)
    assert r["sm_clock_ratio"] == pytest.approx(1455 / 1980)
    assert r["throttled_gpus"] == 1 and r["ecc_uncorrected"] == 0  # GPU 1: ECC not supported
    assert r["xid_errors"] is None  # XIDs need a listening agent; in-process reads none
    assert [(f.severity, f.message) for f in result.findings] == [
        (Severity.INFO, "GPU reading in-process on gpu-host: 2 GPU(s), driver 570.124.06"),
        (Severity.INFO, "GPU 1 is throttled: software power cap"),  # no fault
    ]
    assert r["slowdown_gpus"] == 0 and r["power_capped_gpus"] == 1
    assert result.details["source"] == {"kind": "in-process", "where": "gpu-host"}
    gpu1 = result.details["gpus"][1]
    assert gpu1["clock_event_reasons"] == ["software power cap"] and gpu1["ecc_uncorrected"] is None
    assert result.details["gpus"][0]["processes"] == [
        {"pid": 4242, "used_memory_bytes": 145961779200}
    ]
    assert fake.initialised == 0  # shut down again


async def test_nvml_ecc_errors_are_critical() -> None:
    reading = json.loads((FIXTURES / "nvml" / "h200-x2.json").read_text())
    reading["gpus"][0]["ecc_uncorrected"] = 3
    ctx, _ = context(serve({}), nvml=FakeNvml(reading))
    result = await NvmlProbe().run(target=TARGET, params=NvmlParams(), ctx=ctx)
    critical = [f for f in result.findings if f.severity is Severity.CRITICAL]
    assert [f.message for f in critical] == [
        "GPU 0 has 3 uncorrected ECC errors since boot: drain the node"
    ]


@pytest.mark.parametrize("nvml", [FakeNvml.no_driver(), FakeNvml(None)])
async def test_nvml_without_gpu_is_a_finding(nvml: FakeNvml) -> None:
    ctx, _ = context(serve({}), nvml=nvml, hostname="bot-host")
    result = await NvmlProbe().run(target=TARGET, params=NvmlParams(), ctx=ctx)
    assert result.readings.numbers == {"gpu_count": 0.0}
    (finding,) = result.findings
    assert finding.severity is Severity.INFO
    assert finding.message.startswith("no GPU visible to NVML in-process on bot-host (")
    assert result.details["source"] == {"kind": "in-process", "where": "bot-host"}


async def test_nvml_real_module_without_driver_here() -> None:
    ctx, _ = context(serve({}))  # nvml=None: the probe imports pynvml; this box has no driver
    result = await NvmlProbe().run(target=TARGET, params=NvmlParams(), ctx=ctx)
    assert "no GPU visible to NVML in-process" in result.findings[0].message


async def test_nvml_lost_gpu_is_a_warning_not_a_crash() -> None:
    fake = FakeNvml.from_file(FIXTURES / "nvml" / "h200-x2.json")
    fake.lost.add(1)
    ctx, _ = context(serve({}), nvml=fake, hostname="gpu-host")
    result = await NvmlProbe().run(target=TARGET, params=NvmlParams(), ctx=ctx)
    assert result.readings.numbers == {}
    assert [(f.severity, f.message) for f in result.findings] == [
        (
            Severity.WARNING,
            "GPU reading in-process on gpu-host failed: NVML failed while reading: GPU is lost",
        )
    ]
    assert fake.initialised == 0  # shut down even so


async def test_nvml_other_node_is_not_read_here() -> None:
    target = TargetRef("far", Target(vllm_url="http://e:1", node="gpu-node-9"))
    ctx, _ = context(serve({}), nvml=FakeNvml.no_driver(), hostname="bot-host")
    result = await NvmlProbe().run(target=target, params=NvmlParams(), ctx=ctx)
    assert result.readings.numbers == {} and "runs on gpu-node-9" in result.findings[0].message
    assert "set gpu_agent_url" in result.findings[0].message
    assert result.details["source"] == {"kind": "none", "where": None}


QUERY_RANGE = FIXTURES / "prometheus" / "query_range.json"


async def test_prometheus_probe_range_query() -> None:
    seen: list[httpx.URL] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url)
        return httpx.Response(200, text=QUERY_RANGE.read_text())

    target = TargetRef(
        "a", Target(vllm_url="http://10.0.0.5:8000", prometheus_url="http://prom:9090")
    )
    ctx, _ = context(httpx.MockTransport(handler), wall_clock=lambda: 1_800_000_000.0)
    params = PrometheusParams(
        minutes=5,
        step_s=15,
        queries={"waiting": 'sum(vllm:num_requests_waiting{instance="$instance"})'},
    )
    result = await PrometheusProbe().run(target=target, params=params, ctx=ctx)
    (url,) = seen
    assert url.path == "/api/v1/query_range"
    assert url.params["query"] == 'sum(vllm:num_requests_waiting{instance="10.0.0.5:8000"})'
    assert float(url.params["end"]) - float(url.params["start"]) == 300
    values = [v for _, v in result.details["series"]["waiting"]]
    assert result.readings.numbers == {"waiting_last": values[-1], "waiting_max": max(values)}


async def test_prometheus_probe_without_url_says_so() -> None:
    ctx, _ = context(serve({}))
    params = PrometheusParams(queries={"x": "up"})
    result = await PrometheusProbe().run(target=TARGET, params=params, ctx=ctx)
    assert "no prometheus_url" in result.findings[0].message


@pytest.mark.parametrize(
    ("response", "error", "message"),
    [
        (
            httpx.Response(400, json={"status": "error", "error": "parse error"}),
            ProbeError,
            "parse error",
        ),
        (httpx.Response(502, text="bad gateway"), ProbeError, "without JSON"),
        (None, EndpointError, "cannot reach Prometheus"),
    ],
)
async def test_prometheus_probe_errors(
    response: httpx.Response | None, error: type, message: str
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if response is None:
            raise httpx.ConnectError("refused")
        return response

    target = TargetRef("a", Target(vllm_url="http://e:1", prometheus_url="http://prom:9090"))
    ctx, _ = context(httpx.MockTransport(handler))
    with pytest.raises(error, match=message):
        await PrometheusProbe().run(
            target=target, params=PrometheusParams(queries={"x": "up"}), ctx=ctx
        )
