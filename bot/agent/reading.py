"""One NVML snapshot of every GPU, as plain JSON-ready numbers: the agent serves it, the NVML
probe reads it in-process on single-host installs.

The NVML module (``pynvml`` from nvidia-ml-py) is a parameter, so tests hand in a fake with the
same functions. A value the GPU does not support is ``None``; NVML failing as a whole (no
driver, a lost GPU) raises ``NvmlUnavailable`` with NVML's own words.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

SCHEMA = "ruleloop.nvml/v1"

# Every clock-event reason bit (nvmlClocksEventReason*), by the name on-call reads.
CLOCK_EVENT_REASONS = {
    0x1: "gpu idle",
    0x2: "applications clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "power brake",
    0x100: "display clock setting",
}
# The reasons that mean the GPU is being held back (idle or a clocks setting is not a problem).
THROTTLE_BITS = (0x4, 0x8, 0x20, 0x40, 0x80)


class NvmlUnavailable(Exception):
    """NVML could not be read at all; ``code`` says whether it is missing or failing."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code  # "nvml_unavailable" (no driver/library) or "nvml_error"


def import_pynvml() -> Any:
    """The real ``pynvml`` module, or None when nvidia-ml-py is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def nvml_init(nvml: Any) -> None:
    """``nvmlInit``; a missing driver or library becomes NvmlUnavailable."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(_words(exc), code="nvml_unavailable") from None


def _words(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _maybe(nvml: Any, call: Callable[..., Any] | None, *args: Any) -> Any:
    """One NVML call; None where the GPU or this nvidia-ml-py does not support it."""
    if call is None:
        return None
    try:
        value = call(*args)
    except nvml.NVMLError:
        return None
    return value.decode() if isinstance(value, bytes) else value


def decode_reasons(mask: int | None) -> tuple[list[str], list[str]]:
    """(every active clock-event reason, the ones that hold the GPU back), by name."""
    if mask is None:
        return [], []
    active = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    held = [CLOCK_EVENT_REASONS[bit] for bit in THROTTLE_BITS if mask & bit]
    return active, held


def _memory(nvml: Any, h: Any) -> Any:
    """Memory info v2 (``used`` without the driver's reservation, as nvidia-smi shows it), else
    v1 (drivers before R510, where ``used`` includes the reservation)."""
    v2 = getattr(nvml, "nvmlMemory_v2", None)
    memory = None if v2 is None else _maybe(nvml, nvml.nvmlDeviceGetMemoryInfo, h, v2)
    return memory if memory is not None else _maybe(nvml, nvml.nvmlDeviceGetMemoryInfo, h)


def read_gpu(nvml: Any, index: int, *, max_processes: int) -> dict[str, Any]:
    """Everything read of one GPU (NVML initialised by the caller)."""
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = _memory(nvml, h)
    util = _maybe(nvml, nvml.nvmlDeviceGetUtilizationRates, h)
    power_mw = _maybe(nvml, nvml.nvmlDeviceGetPowerUsage, h)
    limit_mw = _maybe(nvml, nvml.nvmlDeviceGetEnforcedPowerLimit, h)
    # nvidia-ml-py before 12.535 names it ...ClocksThrottleReasons
    reasons_call = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    mask = _maybe(nvml, reasons_call, h)
    active, held = decode_reasons(mask)
    processes = _maybe(nvml, nvml.nvmlDeviceGetComputeRunningProcesses, h) or []

    def ecc(error_type: int) -> Any:
        return _maybe(nvml, nvml.nvmlDeviceGetTotalEccErrors, h, error_type, nvml.NVML_VOLATILE_ECC)

    return {
        "index": index,
        "name": _maybe(nvml, nvml.nvmlDeviceGetName, h),
        "uuid": _maybe(nvml, getattr(nvml, "nvmlDeviceGetUUID", None), h),
        "memory_used_bytes": None if memory is None else memory.used,
        "memory_total_bytes": None if memory is None else memory.total,
        "memory_reserved_bytes": getattr(memory, "reserved", None),
        "utilization_pct": None if util is None else util.gpu,
        "memory_utilization_pct": None if util is None else util.memory,
        "temperature_c": _maybe(nvml, nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
        "power_w": None if power_mw is None else power_mw / 1000.0,
        "power_limit_w": None if limit_mw is None else limit_mw / 1000.0,
        "sm_clock_mhz": _maybe(nvml, nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
        "sm_clock_max_mhz": _maybe(nvml, nvml.nvmlDeviceGetMaxClockInfo, h, nvml.NVML_CLOCK_SM),
        "clock_event_reasons_mask": mask,
        "clock_event_reasons": active,
        "throttle_reasons": held,
        "ecc_uncorrected": ecc(nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        "ecc_corrected": ecc(getattr(nvml, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)),
        "processes": [
            # usedGpuMemory is None where NVML cannot attribute memory (some MIG/vGPU setups)
            {"pid": p.pid, "used_memory_bytes": p.usedGpuMemory}
            for p in processes[:max_processes]
        ],
        "processes_total": len(processes),
    }


def read_snapshot(nvml: Any, *, max_processes: int) -> dict[str, Any]:
    """``driver`` and ``gpus`` of an initialised NVML; NvmlUnavailable if it fails mid-way."""
    try:
        count = nvml.nvmlDeviceGetCount()
        gpus = [read_gpu(nvml, i, max_processes=max_processes) for i in range(count)]
    except nvml.NVMLError as exc:
        message = f"NVML failed while reading: {_words(exc)}"
        raise NvmlUnavailable(message, code="nvml_error") from None
    return {
        "driver": _maybe(nvml, nvml.nvmlSystemGetDriverVersion),
        "nvml_version": _maybe(nvml, getattr(nvml, "nvmlSystemGetNVMLVersion", None)),
        "gpus": gpus,
    }


def read_once(nvml: Any, *, max_processes: int) -> dict[str, Any]:
    """Initialise NVML, take one snapshot, shut down (the in-process reading of the probe)."""
    nvml_init(nvml)
    try:
        return read_snapshot(nvml, max_processes=max_processes)
    finally:
        nvml.nvmlShutdown()
