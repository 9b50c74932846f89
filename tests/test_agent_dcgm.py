"""The DCGM runbook: it loads, wins only for alerts labelled gpu_metrics="dcgm", and its queries,
answered by a real Prometheus holding DCGM-exporter-shaped history, read the GPUs of the
engine's pod and no other (the join on namespace/pod), through the existing prometheus probe.
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import httpx
import pytest

from bot.diagnosis.causes import CauseVerdict, judge_one
from bot.diagnosis.probes.context import ProbeContext, TargetRef
from bot.diagnosis.probes.prometheus import PrometheusParams, PrometheusProbe, instances_regex
from bot.diagnosis.runbooks.builtin import default_registry
from bot.diagnosis.runbooks.loader import LoadedRunbook, load_dir
from bot.diagnosis.runbooks.runner import evaluate
from bot.kernel.config import Target
from bot.kernel.numbers import Measured
from tests.fakes.prometheus_history import openmetrics, prometheus_with

ROOT = Path(__file__).parent.parent
END = dt.datetime(2026, 11, 29, 19, 15, tzinfo=dt.UTC).timestamp()
ALERTS = ["VLLMTimeToFirstTokenP99High", "VLLMQueueTimeP99High", "VLLMKVCacheUsageHigh",
          "VLLMPreemptions", "VLLMWastedPrefillHigh"]  # fmt: skip


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


FIELDS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
          "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK",
          "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
          "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
          "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_THERMAL_VIOLATION",
          "DCGM_FI_DEV_POWER_VIOLATION")  # fmt: skip
# Not among dcgm-exporter's default counters (etc/default-counters.csv has them commented out)
OPTIONAL = frozenset(FIELDS[8:])
# Per GPU, each field's value for the first 20 minutes (the counters' counts so far): vllm-0
# holds GPUs 0-1; other-0 (10.0.0.9:8000) GPU 2, hotter, ECC errors, HW slowdown + HW thermal;
# vllm-9 (10.0.0.50:8000, whose address 10.0.0.5:8000 is a prefix of) GPU 3, the worst of all
STEADY: dict[tuple[str, int], tuple[float, ...]] = {
    # util %, FB used MiB, FB free MiB, temp °C, power W, SM MHz, last XID, row-remap failure,
    # DBE count, SBE count, clock-event reasons, thermal violation, power violation (µs)
    ("vllm-0", 0): (97, 139_000, 4_507, 71, 612.3, 1980, 0, 0, 0, 12, 0x4, 0, 5e6),
    ("vllm-0", 1): (88, 120_000, 23_507, 79, 699.8, 1455, 0, 0, 0, 3, 0x0, 0, 0),
    ("other-0", 2): (100, 143_000, 507, 91, 700.0, 900, 0, 0, 1, 0, 0x48, 1e6, 0),
    ("vllm-9", 3): (100, 143_000, 507, 95, 700.0, 600, 0, 1, 0, 0, 0x40, 0, 0),
}
# What changed 10 minutes before the end: (pod, GPU, field) -> the value from then on
CHANGES = {
    ("vllm-0", 1, "DCGM_FI_DEV_XID_ERRORS"): 79,
    ("vllm-0", 1, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"): 5,
    ("vllm-0", 0, "DCGM_FI_DEV_POWER_VIOLATION"): 9e6,
    ("other-0", 2, "DCGM_FI_DEV_XID_ERRORS"): 43,
    ("other-0", 2, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"): 4,
    ("other-0", 2, "DCGM_FI_DEV_THERMAL_VIOLATION"): 3e6,
    ("vllm-9", 3, "DCGM_FI_DEV_XID_ERRORS"): 48,
    ("vllm-9", 3, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"): 7,
}
ENGINES = {"vllm-0": "10.0.0.5:8000", "other-0": "10.0.0.9:8000", "vllm-9": "10.0.0.50:8000"}


def history(
    *,
    labels_as: str = "pod",
    changes: Mapping[tuple[str, int, str], float] = CHANGES,
    without: Collection[str] = (),
    reasons_as: str = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
) -> str:
    """30 minutes of DCGM series for the GPUs of STEADY, changed 10 minutes before the end as
    ``changes`` says; the fields in ``without`` not exported; the clock-event reasons under
    ``reasons_as`` (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS: its deprecated name, the same field; ``both``: a counters CSV listing both)."""
    times = [END - 30 * 60 + 30 * i for i in range(61)]
    series: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
    for (pod, gpu), values in STEADY.items():
        for name, value in zip(FIELDS, values, strict=True):
            if name in without:
                continue
            after = changes.get((pod, gpu, name), value)
            exported = [name]
            if name == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" and reasons_as != "both":
                exported = [reasons_as]
            elif name == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS":
                exported = [name, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]
            for as_name in exported:
                series[(as_name, _gpu(pod, gpu, labels_as))] = [
                    (t, after if t >= END - 600 else value) for t in times
                ]
    for pod, instance in ENGINES.items():
        labels = (("instance", instance), ("namespace", "inference"), ("pod", pod))
        series[("vllm:num_requests_running", labels)] = [(t, 4) for t in times]
    return openmetrics(series)


async def read(prometheus_url: str, *, replicas: Sequence[str] = ()) -> dict[str, float | None]:
    """The DCGM runbook's prometheus step on vllm-0's engine (or a fleet of ``replicas``)."""
    loaded = dcgm_runbook()
    (params,) = [p for p in loaded.params if isinstance(p, PrometheusParams)]
    target = TargetRef(
        "prod-a",
        Target(
            vllm_url="http://10.0.0.5:8000", replicas=list(replicas), prometheus_url=prometheus_url
        ),
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
    # the fields off by default, read when exported: GPU 1's 2 new corrected ECC errors, GPU 0
    # at its software power cap (no fault), 4 s of power violation; other-0's DBE errors,
    # hardware slowdown and thermal violation are another pod's
    assert r["gpu_ecc_dbe_errors_last"] == 0
    assert r["gpu_ecc_sbe_errors_last"] == pytest.approx(2, rel=0.05)
    assert r["gpu_slowdown_gpus_max"] == 0 and r["gpu_power_capped_gpus_last"] == 1
    assert r["gpu_thermal_violation_last"] == 0
    assert r["gpu_power_violation_last"] == pytest.approx(4e6, rel=0.05)
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


def gpu_fault(r: Mapping[str, float | None]) -> CauseVerdict:
    """The DCGM runbook's gpu_fault hypothesis judged on the prometheus step's readings."""
    (hypothesis,) = [h for h in dcgm_runbook().runbook.hypotheses if h.cause == "gpu_fault"]
    readings = Measured.of({f"prometheus.{k}": v for k, v in r.items()})
    return judge_one(hypothesis, "GPU fault", readings)


NO_XID = {k: v for k, v in CHANGES.items() if k[2] != "DCGM_FI_DEV_XID_ERRORS"}
HW_THERMAL = {**NO_XID, ("vllm-0", 0, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"): 0x44}
DBE = {**NO_XID, ("vllm-0", 1, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"): 2}


@pytest.mark.parametrize("labels_as", ["pod", "exported_pod"])
@pytest.mark.parametrize(
    ("changes", "reasons_as", "verdict"),
    [
        (NO_XID, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "ruled_out"),
        (DBE, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "supported"),
        (HW_THERMAL, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "supported"),
        (HW_THERMAL, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "supported"),
        (HW_THERMAL, "both", "supported"),
    ],
    ids=["clear", "dbe-ecc", "hw-thermal", "hw-thermal-old-name", "hw-thermal-both-names"],
)
async def test_gpu_fault_reads_ecc_and_clock_events(
    tmp_path: Path,
    labels_as: str,
    changes: Mapping[tuple[str, int, str], float],
    reasons_as: str,
    verdict: str,
) -> None:
    """No XID on the engine's GPUs: an uncorrectable ECC error in the window, or hardware
    thermal slowdown on (beside the software power cap: 0x44), supports gpu_fault under either
    name of the clock-event field; all clear (the power cap alone is no fault) rules it out.
    Another pod's DBE errors and slowdown (other-0, vllm-9) never count."""
    _needs_prometheus()
    history_ = history(labels_as=labels_as, changes=changes, reasons_as=reasons_as)
    with prometheus_with(history_, tmp_path) as url:
        r = await read(url)
    assert r["gpu_last_xid_last"] == 0 and r["gpu_power_capped_gpus_max"] == 1
    judged = gpu_fault(r)
    assert judged.verdict == verdict, judged
    if changes is DBE:
        assert r["gpu_ecc_dbe_errors_last"] == pytest.approx(2, rel=0.05)
        assert r["gpu_slowdown_gpus_max"] == 0
    if changes is HW_THERMAL:
        assert r["gpu_slowdown_gpus_max"] == 1 and r["gpu_ecc_dbe_errors_last"] == 0
    found = {
        f.message
        for f in evaluate(dcgm_runbook(), Measured.of({f"prometheus.{k}": v for k, v in r.items()}))
    }
    assert bool(found) is (verdict == "supported"), found


async def test_gpu_fault_cannot_tell_without_the_fields_off_by_default(tmp_path: Path) -> None:
    """dcgm-exporter's default counters: no ECC counts, clock-event reasons or violation times.
    With XID and row remaps clear, gpu_fault is 'cannot tell', naming what was not measured
    (never ruled out on the fields DCGM does not export)."""
    _needs_prometheus()
    with prometheus_with(history(changes=NO_XID, without=OPTIONAL), tmp_path) as url:
        r = await read(url)
    assert r["gpu_last_xid_last"] == 0 and r["gpu_row_remap_failure_max"] == 0
    assert r["gpu_ecc_dbe_errors_last"] is None and r["gpu_slowdown_gpus_max"] is None
    judged = gpu_fault(r)
    assert judged.verdict == "cannot_tell"
    assert set(judged.missing) == {
        "prometheus.gpu_ecc_dbe_errors_last",
        "prometheus.gpu_slowdown_gpus_max",
        "prometheus.gpu_thermal_violation_last",
    }
    # an XID still supports it: what is exported decides what it can
    with_xid = {**r, "gpu_last_xid_last": 79.0}
    assert gpu_fault(with_xid).verdict == "supported"


@pytest.mark.parametrize("labels_as", ["pod", "exported_pod"])
async def test_a_fleet_reads_every_replicas_gpus_and_no_others(
    tmp_path: Path, labels_as: str
) -> None:
    """A fleet of vllm-0 and other-0: $instances joins both replicas' pods, so other-0's GPU 2
    (91 °C, 3 new DBE errors, HW slowdown + HW thermal) is read; vllm-9 (10.0.0.50:8000, whose
    address begins like 10.0.0.5:8000) is no replica and is never read (95 °C, 7 DBE)."""
    _needs_prometheus()
    fleet = ["http://10.0.0.5:8000", "http://10.0.0.9:8000"]
    with prometheus_with(history(labels_as=labels_as, changes=NO_XID), tmp_path) as url:
        r = await read(url, replicas=fleet)
    assert r["gpu_temperature_c_max"] == 91 and r["gpu_sm_clock_mhz_last"] == 900
    assert r["gpu_ecc_dbe_errors_last"] == pytest.approx(3, rel=0.05)
    assert r["gpu_slowdown_gpus_max"] == 1 and r["gpu_row_remap_failure_max"] == 0
    assert r["gpu_thermal_violation_last"] == pytest.approx(2e6, rel=0.05)
    assert gpu_fault(r).verdict == "supported"


def test_instances_is_an_anchored_alternation_of_the_replicas() -> None:
    """Dots escaped (10.0.0.5 never matches 10.0.0.59...), backslashes doubled for PromQL's
    double-quoted string, each replica once."""
    regex = instances_regex(["10.0.0.5:8000", "10.0.0.9:8000", "10.0.0.5:8000", "[fe80::1]:8000"])
    assert regex == r"10\\.0\\.0\\.5:8000|10\\.0\\.0\\.9:8000|\\[fe80::1\\]:8000"
