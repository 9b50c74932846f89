"""A fake of the `pynvml` module: the functions the NVML probe calls, replaying one reading."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0


class NVMLError(Exception):
    """pynvml's base error: carries the NVML return code in ``value``."""

    def __init__(self, value: int, text: str) -> None:
        self.value = value
        super().__init__(text)


class FakeNvml:
    """Module-like object: ``FakeNvml.from_file(path)`` or ``FakeNvml.no_driver()``."""

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = NVML_VOLATILE_ECC

    def __init__(
        self, reading: dict[str, Any] | None, *, init_error: NVMLError | None = None
    ) -> None:
        self.reading = reading or {"driver": "", "gpus": []}
        self.init_error = init_error
        self.initialised = 0

    @classmethod
    def from_file(cls, path: Path) -> FakeNvml:
        """Replay a reading stored as JSON."""
        return cls(json.loads(path.read_text()))

    @classmethod
    def no_driver(cls) -> FakeNvml:
        """What pynvml does on a host without the NVIDIA driver."""
        return cls(None, init_error=NVMLError(12, "NVML Shared Library Not Found"))

    def _gpu(self, handle: int, key: str) -> Any:
        value = self.reading["gpus"][handle][key]
        if value is None:
            raise NVMLError(3, "Not Supported")
        return value

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self.reading["driver"])

    def nvmlDeviceGetCount(self) -> int:
        return len(self.reading["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, h: int) -> str:
        return str(self._gpu(h, "name"))

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(**self._gpu(h, "memory"))

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(**self._gpu(h, "utilization"))

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == NVML_TEMPERATURE_GPU
        return int(self._gpu(h, "temperature"))

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return int(self._gpu(h, "power_mw"))

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return int(self._gpu(h, "power_limit_mw"))

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        assert clock == NVML_CLOCK_SM
        return int(self._gpu(h, "sm_clock"))

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        assert clock == NVML_CLOCK_SM
        return int(self._gpu(h, "sm_clock_max"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return int(self._gpu(h, "clock_event_reasons"))

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)
        return int(self._gpu(h, "ecc_uncorrected"))

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(**p) for p in self._gpu(h, "processes")]
