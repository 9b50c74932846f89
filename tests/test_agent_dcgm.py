"""The DCGM runbook: it loads, wins only for alerts labelled gpu_metrics="dcgm", and its queries,
answered by a real Prometheus holding DCGM-exporter-shaped history, read the GPUs of the
engine's pod and no other (the join on namespace/pod), through the existing prometheus probe.
"""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import httpx
import pytest

from bot.diagnosis.probes.context import ProbeContext, TargetRef
from bot.diagnosis.probes.prometheus import PrometheusParams, PrometheusProbe
from bot.diagnosis.runbooks.builtin import default_registry
from bot.diagnosis.runbooks.loader import LoadedRunbook, load_dir
from bot.diagnosis.runbooks.runner import evaluate
from bot.kernel.config import Target
from bot.kernel.numbers import Measured
from tests.fakes.prometheus_history import openmetrics, prometheus_with

ROOT = Path(__file__).parent.parent
END = dt.datetime(2026, 11, 29, 19, 15, tzinfo=dt.UTC).timestamp()
ENGINE = (("instance", "10.0.0.5:8000"), ("namespace", "inference"), ("pod", "vllm-0"))
ALERTS = ["VLLMTimeToFirstTokenP99High", "VLLMQueueTimeP99High", "VLLMKVCacheUsageHigh",
          "VLLMPreemptions", "VLLMWastedPrefillHigh"]  # fmt: skip
MIB = 1.0  # DCGM reports framebuffer memory in MiB


def dcgm_runbook() -> LoadedRunbook:
    runbooks = load_dir(ROOT / "runbooks", default_registry())
    (loaded,) = [rb for rb in runbooks.runbooks if rb.name == "vllm-latency-dcgm"]
    return loaded


@pytest.mark.parametrize("alertname", ALERTS)
def test_the_dcgm_runbook_wins_only_for_alerts_labelled_dcgm(alertname: str) -> None:
    runbooks = load_dir(ROOT / "runbooks", default_registry())
    assert runbooks.select({"alertname": alertname}).name == "vllm-latency"  # type: ignore[union-attr]
    dcgm = runbooks.select({"alertname": alertname, "gpu_metrics": "dcgm"})
    assert dcgm is not None and dcgm.name == "vllm-latency-dcgm"
    assert runbooks.select({"requested_by": "U1", "gpu_metrics": "dcgm"}).name == "default"  # type: ignore[union-attr]


def test_the_dcgm_runbook_reads_no_nvml() -> None:
    probes = [step.probe for step in dcgm_runbook().runbook.probes]
    assert probes == ["vllm_metrics", "queue_cancel", "prometheus"]


def _gpu(pod: str, gpu: int, labels_as: str = "pod") -> tuple[tuple[str, str], ...]:
    """One GPU's labels as dcgm-exporter's Kubernetes mapping gives them: scraped with
    honorLabels (``pod``), or as the GPU Operator's ServiceMonitor scrapes it (``exported_pod``:
    the workload's labels renamed, ``namespace``/``pod`` the exporter's own pod), or without the
    mapping (``none``: no workload labels at all)."""
    device = (("Hostname", "gpu-node-7"), ("UUID", f"GPU-{pod}-{gpu}"), ("gpu", str(gpu)),
              ("device", f"nvidia{gpu}"), ("modelName", "NVIDIA H200"),
              ("DCGM_FI_DRIVER_VERSION", "570.124.06"))  # fmt: skip
    if labels_as == "pod":
        return (*device, ("namespace", "inference"), ("pod", pod), ("container", "vllm"))
    exporter = (("namespace", "gpu-operator"), ("pod", "nvidia-dcgm-exporter-x7k2p"),
                ("container", "nvidia-dcgm-exporter"), ("instance", "10.0.3.7:9400"))  # fmt: skip
    if labels_as == "none":
        return (*device, *exporter)
    return (*device, *exporter, ("exported_namespace", "inference"), ("exported_pod", pod),
            ("exported_container", "vllm"))  # fmt: skip


def history(*, labels_as: str = "pod") -> str:
    """30 minutes of DCGM series: vllm-0 holds GPUs 0-1, other-0 holds GPU 2 (hotter, XID 43)."""
    gpus = {
        # (pod, gpu): util %, FB used MiB, FB free MiB, temp °C, power W, SM clock MHz, last XID
        ("vllm-0", 0): (97, 139_000, 4_507, 71, 612.3, 1980, 0),
        ("vllm-0", 1): (88, 120_000, 23_507, 79, 699.8, 1455, 79),
        ("other-0", 2): (100, 143_000, 507, 91, 700.0, 900, 43),
    }
    names = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
             "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK",
             "DCGM_FI_DEV_XID_ERRORS"]  # fmt: skip
    times = [END - 30 * 60 + 30 * i for i in range(61)]
    series: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
    for (pod, gpu), values in gpus.items():
        for name, value in zip(names, values, strict=True):
            # the XID appears 10 minutes before the end; everything else holds steady
            samples = [(t, value if name != "DCGM_FI_DEV_XID_ERRORS" or t >= END - 600 else 0)
                       for t in times]  # fmt: skip
            series[(name, _gpu(pod, gpu, labels_as))] = samples
        series[("DCGM_FI_DEV_ROW_REMAP_FAILURE", _gpu(pod, gpu, labels_as))] = [
            (t, 0) for t in times
        ]
    series[("vllm:num_requests_running", ENGINE)] = [(t, 4) for t in times]
    series[("vllm:num_requests_running", (("instance", "10.0.0.9:8000"), ("namespace", "inference"),
                                           ("pod", "other-0")))] = [(t, 1) for t in times]  # fmt: skip
    return openmetrics(series)


async def read(prometheus_url: str) -> dict[str, float | None]:
    loaded = dcgm_runbook()
    (params,) = [p for p in loaded.params if isinstance(p, PrometheusParams)]
    target = TargetRef(
        "prod-a", Target(vllm_url="http://10.0.0.5:8000", prometheus_url=prometheus_url)
    )
    async with httpx.AsyncClient(timeout=30) as http:
        ctx = ProbeContext(http=http, wall_clock=lambda: END)
        result = await PrometheusProbe().run(target=target, params=params, ctx=ctx)
    return result.readings.numbers


def _needs_prometheus() -> None:
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (`make test` installs it)")


@pytest.mark.parametrize("labels_as", ["pod", "exported_pod"])
async def test_dcgm_queries_read_the_engines_gpus_only(tmp_path: Path, labels_as: str) -> None:
    """With honorLabels, and as the GPU Operator's ServiceMonitor scrapes dcgm-exporter (the
    workload's labels as exported_namespace/exported_pod): the same GPUs, the same numbers."""
    _needs_prometheus()
    with prometheus_with(history(labels_as=labels_as), tmp_path) as url:
        r = await read(url)
    # GPUs 0 and 1 are the engine's; GPU 2 (util 100 %, 91 °C, XID 43) is another pod's
    assert r["gpu_util_pct_last"] == 97
    assert r["gpu_memory_used_ratio_last"] == pytest.approx(139_000 / 143_507)
    assert r["gpu_temperature_c_max"] == 79 and r["gpu_power_w_last"] == pytest.approx(699.8)
    assert r["gpu_sm_clock_mhz_last"] == 1455
    assert r["gpu_last_xid_last"] == 79 and r["gpu_row_remap_failure_max"] == 0
    # the runbook's own finding rules on those readings
    found = {
        f.message
        for f in evaluate(dcgm_runbook(), Measured.of({f"prometheus.{k}": v for k, v in r.items()}))
    }
    assert found == {
        "a GPU of this engine reports XID 79 as its last XID error (DCGM): check the node's kernel log"
    }


async def test_without_the_workload_mapping_the_join_reads_nothing(tmp_path: Path) -> None:
    """dcgm-exporter without its Kubernetes mapping: no series names a workload pod, the join
    matches no GPU, and the readings are absent (no finding), never another pod's (the
    exporter's own namespace/pod match no engine)."""
    _needs_prometheus()
    with prometheus_with(history(labels_as="none"), tmp_path) as url:
        r = await read(url)
    assert r["gpu_util_pct_last"] is None and r["gpu_last_xid_last"] is None
