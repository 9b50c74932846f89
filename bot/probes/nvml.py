"""The NVML probe: memory, utilisation, temperature, power, clocks, throttling, ECC, processes.

The NVML module (``pynvml`` from nvidia-ml-py) is a parameter: tests hand in a fake with the
same functions. NVML reads the GPUs of the host the bot runs on; without a driver the probe
says "no GPU visible" as a finding instead of failing.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from pydantic import Field

from bot.runbooks.context import ProbeContext, TargetRef
from bot.runbooks.types import Finding, Params, ProbeResult, Severity

# Clock-event reason bits (nvmlClocksEventReason*) that mean the GPU is being held back.
THROTTLE_REASONS = {
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "power brake",
}
READINGS = {
    "gpu_count": "GPUs visible to NVML",
    "memory_used_ratio": "highest share of GPU memory in use",
    "utilization_pct": "highest GPU utilisation (%)",
    "temperature_c": "hottest GPU (°C)",
    "power_limit_ratio": "highest power draw / enforced limit",
    "sm_clock_ratio": "lowest SM clock / its maximum",
    "throttled_gpus": "GPUs held back by power or thermal limits",
    "ecc_uncorrected": "volatile uncorrected ECC errors, all GPUs",
}


class NvmlParams(Params):
    """How many processes per GPU to list."""

    max_processes: int = Field(default=5, ge=0, le=100)


class NvmlProbe:
    """Reads every GPU through NVML."""

    name: ClassVar[str] = "nvml"
    params_model: ClassVar[type[Params]] = NvmlParams

    def readings(self, params: Params) -> Mapping[str, str]:
        """Always the same readings."""
        return READINGS

    async def run(self, *, target: TargetRef, params: Params, ctx: ProbeContext) -> ProbeResult:
        """Read NVML in a worker thread (its calls block)."""
        assert isinstance(params, NvmlParams)
        node = target.target.node
        if node and node != ctx.hostname:
            message = (
                f"NVML reads only this host ({ctx.hostname}); {target.name} runs on {node}: "
                "run a bot replica there or scrape its DCGM exporter with the prometheus probe"
            )
            return ProbeResult(findings=[Finding(Severity.INFO, message, self.name)])
        nvml = ctx.nvml if ctx.nvml is not None else _import_pynvml()
        if nvml is None:
            return _no_gpu("nvidia-ml-py is not installed")
        return await asyncio.to_thread(read_all, nvml, max_processes=params.max_processes)


def _import_pynvml() -> Any:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def _no_gpu(why: str) -> ProbeResult:
    message = f"no GPU visible to NVML on this host ({why})"
    return ProbeResult(
        readings={"gpu_count": 0.0}, findings=[Finding(Severity.INFO, message, NvmlProbe.name)]
    )


def read_all(nvml: Any, *, max_processes: int) -> ProbeResult:
    """Initialise NVML, read every GPU, shut down; a missing driver is a finding."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return _no_gpu(str(exc) or type(exc).__name__)
    try:
        gpus = [
            read_gpu(nvml, i, max_processes=max_processes) for i in range(nvml.nvmlDeviceGetCount())
        ]
        driver = _maybe(nvml, nvml.nvmlSystemGetDriverVersion)
    finally:
        nvml.nvmlShutdown()
    if not gpus:
        return _no_gpu("the driver lists no devices")
    return summarize(gpus, driver=driver)


def _maybe(nvml: Any, call: Callable[..., Any], *args: Any) -> Any:
    """One NVML call; None where the GPU does not support it."""
    try:
        value = call(*args)
    except nvml.NVMLError:
        return None
    return value.decode() if isinstance(value, bytes) else value


def read_gpu(nvml: Any, index: int, *, max_processes: int) -> dict[str, Any]:
    """Everything the probe reads of one GPU, as plain numbers (None: not supported)."""
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = _maybe(nvml, nvml.nvmlDeviceGetMemoryInfo, h)
    util = _maybe(nvml, nvml.nvmlDeviceGetUtilizationRates, h)
    power_mw = _maybe(nvml, nvml.nvmlDeviceGetPowerUsage, h)
    limit_mw = _maybe(nvml, nvml.nvmlDeviceGetEnforcedPowerLimit, h)
    reasons_call = (
        getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or nvml.nvmlDeviceGetCurrentClocksThrottleReasons  # nvidia-ml-py before 12.535
    )
    reasons = _maybe(nvml, reasons_call, h)
    processes = _maybe(nvml, nvml.nvmlDeviceGetComputeRunningProcesses, h) or []
    return {
        "index": index,
        "name": _maybe(nvml, nvml.nvmlDeviceGetName, h),
        "memory_used_bytes": None if memory is None else memory.used,
        "memory_total_bytes": None if memory is None else memory.total,
        "utilization_pct": None if util is None else util.gpu,
        "temperature_c": _maybe(nvml, nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
        "power_w": None if power_mw is None else power_mw / 1000.0,
        "power_limit_w": None if limit_mw is None else limit_mw / 1000.0,
        "sm_clock_mhz": _maybe(nvml, nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
        "sm_clock_max_mhz": _maybe(nvml, nvml.nvmlDeviceGetMaxClockInfo, h, nvml.NVML_CLOCK_SM),
        "throttle_reasons": []
        if reasons is None
        else [why for bit, why in THROTTLE_REASONS.items() if reasons & bit],
        "ecc_uncorrected": _maybe(
            nvml,
            nvml.nvmlDeviceGetTotalEccErrors,
            h,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        ),  # fmt: skip
        "processes": [
            {"pid": p.pid, "used_memory_bytes": p.usedGpuMemory} for p in processes[:max_processes]
        ],
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _extreme(pick: Callable[..., float], values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(pick(present)) if present else None


def summarize(gpus: list[dict[str, Any]], *, driver: str | None) -> ProbeResult:
    """Readings across GPUs (worst GPU counts), findings for throttling and ECC errors."""
    findings = []
    for gpu in gpus:
        if gpu["throttle_reasons"]:
            why = ", ".join(gpu["throttle_reasons"])
            findings.append(
                Finding(Severity.WARNING, f"GPU {gpu['index']} is throttled: {why}", NvmlProbe.name)
            )
        if gpu["ecc_uncorrected"]:
            findings.append(Finding(
                Severity.CRITICAL,
                f"GPU {gpu['index']} has {gpu['ecc_uncorrected']} uncorrected ECC errors "
                "since boot: drain the node",
                NvmlProbe.name,
                float(gpu["ecc_uncorrected"]),
            ))  # fmt: skip
    ecc = [g["ecc_uncorrected"] for g in gpus if g["ecc_uncorrected"] is not None]
    readings = {
        "gpu_count": float(len(gpus)),
        "memory_used_ratio": _extreme(
            max, [_ratio(g["memory_used_bytes"], g["memory_total_bytes"]) for g in gpus]
        ),
        "utilization_pct": _extreme(max, [g["utilization_pct"] for g in gpus]),
        "temperature_c": _extreme(max, [g["temperature_c"] for g in gpus]),
        "power_limit_ratio": _extreme(
            max, [_ratio(g["power_w"], g["power_limit_w"]) for g in gpus]
        ),
        "sm_clock_ratio": _extreme(
            min, [_ratio(g["sm_clock_mhz"], g["sm_clock_max_mhz"]) for g in gpus]
        ),
        "throttled_gpus": float(sum(1 for g in gpus if g["throttle_reasons"])),
        "ecc_uncorrected": float(sum(ecc)) if ecc else None,
    }
    return ProbeResult(
        readings=readings, findings=findings, details={"driver": driver, "gpus": gpus}
    )
