"""The slow replica's own GPU (issue 44 item 3): a fleet of two replicas whose /metrics pages are
served at the wire (one with a slow TTFT), a real Prometheus holding dcgm-exporter's series under
its real names and label sets (workload labels as namespace/pod, or as the GPU Operator's
ServiceMonitor leaves them: exported_namespace/exported_pod), the DCGM runbook run by the
Diagnoser. The fleet verdict names the slow replica; gpu_fault is judged on that replica's own
GPU, read again from Prometheus for its pod alone: its own XID is named as its own, and another
replica's XID (the fleet's worst GPU) is not blamed on it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from bot.adr import AdrStore
from bot.diagnosis import Diagnoser, Diagnosis, cause_text
from bot.diagnosis.probes import ProbeContext, TargetRef
from bot.diagnosis.runbooks import RunbookRunner, default_registry, load_dir
from bot.kernel.config import Target
from tests.fakes.clock import FakeTime
from tests.fakes.metrics_server import RecordedMetrics
from tests.fakes.prometheus_history import openmetrics, prometheus_with
from tests.test_agent_dcgm import FIELDS, _gpu, _needs_prometheus
from tests.test_fleet_diagnosis import FAST, SLOW, page

ROOT = Path(__file__).parent.parent
END = dt.datetime(2026, 11, 29, 19, 15, tzinfo=dt.UTC).timestamp()
LABELS = {"alertname": "VLLMTimeToFirstTokenP99High", "gpu_metrics": "dcgm"}
# One GPU per pod, every field exported and clear: util %, FB used/free MiB, temp °C, power W,
# SM MHz, last XID, row-remap failure, DBE, SBE, clock-event reasons, thermal/power violation
CLEAR = (90, 100_000, 43_507, 70, 600.0, 1980, 0, 0, 0, 0, 0x0, 0, 0)
PODS = {"slow": ("vllm-a", 0), "fast": ("vllm-b", 1)}


def dcgm_history(instances: Mapping[str, str], xids: Mapping[str, int], labels_as: str) -> str:
    """30 minutes of DCGM series for the replicas' GPUs (``xids``: the replica whose GPU
    reports which XID from 10 minutes before the end) and each vLLM pod's running gauge, under
    the instance Prometheus scrapes it as."""
    times = [END - 30 * 60 + 30 * i for i in range(61)]
    series: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
    for replica, (pod, gpu) in PODS.items():
        for name, value in zip(FIELDS, CLEAR, strict=True):
            after = xids.get(replica, value) if name == "DCGM_FI_DEV_XID_ERRORS" else value
            series[(name, _gpu(pod, gpu, labels_as))] = [
                (t, after if t >= END - 600 else value) for t in times
            ]
        labels = (("instance", instances[replica]), ("namespace", "inference"), ("pod", pod))
        series[("vllm:num_requests_running", labels)] = [(t, 2) for t in times]
    return openmetrics(series)


@contextmanager
def fleet() -> Iterator[dict[str, str]]:
    """The two replicas' /metrics at the wire: 40 requests per scrape each, one slow."""
    with ExitStack() as stack:
        urls = {}
        for i, (replica, ttft) in enumerate((("slow", SLOW), ("fast", FAST))):
            pages = [page(ttft, started=1000.0 + i, scrape=n) for n in range(1, 60)]
            urls[replica] = stack.enter_context(RecordedMetrics(pages)).base_url
        yield urls


async def diagnose(urls: Mapping[str, str], prometheus_url: str, tmp_path: Path) -> Diagnosis:
    """The DCGM runbook on the fleet, the window's clock moved by its own sleeps."""
    runbooks = load_dir(ROOT / "runbooks", default_registry())
    target = Target(
        vllm_url=urls["slow"], replicas=[urls["slow"], urls["fast"]], prometheus_url=prometheus_url
    )
    time = FakeTime()
    async with httpx.AsyncClient(timeout=30) as http:
        diagnoser = Diagnoser(
            runbooks=runbooks,
            runner=RunbookRunner(registry=default_registry()),
            adrs=AdrStore(root=tmp_path / "adrs"),
            context=lambda: ProbeContext(
                http=http, monotonic=time.clock, sleep=time.sleep, wall_clock=lambda: END
            ),
            clock=lambda: dt.datetime.fromtimestamp(END, dt.UTC),
        )
        return await diagnoser.diagnose(TargetRef("prod-a", target), labels=LABELS)


async def run(tmp_path: Path, xids: Mapping[str, int], labels_as: str) -> tuple[Diagnosis, str]:
    """The diagnosis, and the slow replica's address as the fleet verdict names it."""
    _needs_prometheus()
    with fleet() as urls:
        instances = {r: u.removeprefix("http://") for r, u in urls.items()}
        history = dcgm_history(instances, xids, labels_as)
        with prometheus_with(history, tmp_path / "prometheus") as prometheus_url:
            diagnosis = await diagnose(urls, prometheus_url, tmp_path)
    assert diagnosis.runbook == "vllm-latency-dcgm"
    assert diagnosis.replicas is not None
    assert [r.address for r in diagnosis.replicas.slow] == [instances["slow"]]
    return diagnosis, instances["slow"]


def gpu_fault(diagnosis: Diagnosis) -> tuple[str, str, str | None]:
    (verdict,) = [v for v in diagnosis.causes if v.cause == "gpu_fault"]
    return verdict.verdict, verdict.evidence, verdict.number


@pytest.mark.parametrize("labels_as", ["pod", "exported_pod"])
@pytest.mark.parametrize("xids", [{"slow": 79}, {"slow": 79, "fast": 94}], ids=["own", "both"])
async def test_the_slow_replicas_own_gpu_fault_is_named_as_its_own(
    tmp_path: Path, labels_as: str, xids: Mapping[str, int]
) -> None:
    """XID 79 on the slow replica's GPU: gpu_fault is supported on its own GPU, and the thread
    says so, naming it; with XID 94 on the other replica's GPU too (the fleet's worst GPU reads
    94), the slow one's own XID 79 is the one named."""
    diagnosis, slow = await run(tmp_path, xids, labels_as)
    fleet_worst = diagnosis.readings.value("prometheus.gpu_last_xid_last")
    assert fleet_worst == max(xids.values())
    verdict, evidence, number = gpu_fault(diagnosis)
    assert verdict == "supported"
    assert evidence.startswith(f"the slow replica {slow}'s own GPUs: DCGM reports XID 79 ")
    assert number is not None and number.startswith(f"{slow}'s own GPUs: last XID 79,")
    lines = cause_text.plain_text(diagnosis.causes)
    assert any(line.startswith("supported: ") and f"{slow}'s own GPUs: " in line for line in lines)


@pytest.mark.parametrize("labels_as", ["pod", "exported_pod"])
async def test_another_replicas_gpu_fault_is_not_blamed_on_the_slow_one(
    tmp_path: Path, labels_as: str
) -> None:
    """XID 43 on the fast replica's GPU only: the fleet's worst GPU reports it (the runbook's
    finding says a GPU of the fleet does), but the slow replica's own GPU is clear, so gpu_fault
    is ruled out for it; the number says whose the XID is."""
    diagnosis, slow = await run(tmp_path, {"fast": 43}, labels_as)
    assert diagnosis.readings.value("prometheus.gpu_last_xid_last") == 43  # the fleet's worst
    verdict, evidence, number = gpu_fault(diagnosis)
    assert verdict == "ruled_out", evidence
    assert number is not None and number.startswith(f"{slow}'s own GPUs: last XID 0,")
    assert "the fleet's worst GPU, not the slow replica's: last XID 43" in number
    lines = cause_text.plain_text(diagnosis.causes)
    assert any(line.startswith("ruled out: ") and f"{slow}'s own GPUs" in line for line in lines)
