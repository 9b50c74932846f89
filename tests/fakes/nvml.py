"""A fake of the `pynvml` module: the functions the NVML probe and the agent call, replaying one
reading (tests/fixtures/nvml/*.json; the constants are nvidia-ml-py's).

In-process it is handed to the probe as ``ProbeContext.nvml``. A `ruleloop agent` subprocess gets
it the same way, as the module it imports: ``python -m tests.fakes.nvml --fixture F -- agent ...``
puts the fake in ``sys.modules["pynvml"]`` and runs the real `ruleloop` command line.
"""

from __future__ import annotations

import json
import queue
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
nvmlEventTypeXidCriticalError = 0x8


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
    NVML_MEMORY_ERROR_TYPE_CORRECTED = NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = NVML_VOLATILE_ECC
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    nvmlMemory_v2 = 0x02000028
    nvmlEventTypeXidCriticalError = nvmlEventTypeXidCriticalError

    def __init__(
        self, reading: dict[str, Any] | None, *, init_error: NVMLError | None = None
    ) -> None:
        self.reading = reading or {"driver": "", "gpus": []}
        self.init_error = init_error
        self.initialised = 0
        self.lost: set[int] = set()  # GPUs whose handle NVML refuses ("GPU is lost")
        self.events: queue.Queue[tuple[int, int]] = queue.Queue()  # (gpu, xid) to deliver
        self.registered: set[int] = set()

    @classmethod
    def from_file(cls, path: Path) -> FakeNvml:
        """Replay a reading stored as JSON."""
        return cls(json.loads(path.read_text()))

    @classmethod
    def no_driver(cls) -> FakeNvml:
        """What pynvml does on a host without the NVIDIA driver."""
        return cls(None, init_error=NVMLError(12, "NVML Shared Library Not Found"))

    def raise_xid(self, gpu: int, xid: int) -> None:
        """An XID error on one GPU: delivered to whoever registered for XID events."""
        self.events.put((gpu, xid))

    def _gpu(self, handle: int, key: str) -> Any:
        value = self.reading["gpus"][handle].get(key)
        if value is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED, "Not Supported")
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

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "13." + str(self.reading["driver"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index in self.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST, "GPU is lost")
        return index

    def nvmlDeviceGetIndex(self, h: int) -> int:
        return h

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return str(self.reading["gpus"][h].get("uuid") or f"GPU-00000000-fake-{h:04d}")

    def nvmlDeviceGetName(self, h: int) -> str:
        return str(self._gpu(h, "name"))

    def nvmlDeviceGetMemoryInfo(self, h: int, version: int | None = None) -> SimpleNamespace:
        memory = dict(self._gpu(h, "memory"))
        if version is None:  # v1: `used` includes the driver's reservation
            memory["used"] += memory.pop("reserved", 0)
        else:
            assert version == self.nvmlMemory_v2
            memory.setdefault("reserved", 0)
        return SimpleNamespace(**memory)

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
        assert counter == NVML_VOLATILE_ECC
        key = {NVML_MEMORY_ERROR_TYPE_UNCORRECTED: "ecc_uncorrected",
               NVML_MEMORY_ERROR_TYPE_CORRECTED: "ecc_corrected"}[error_type]  # fmt: skip
        return int(self._gpu(h, key))

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(**p) for p in self._gpu(h, "processes")]

    # XID events: what pynvml's event-set functions do, on a queue instead of the driver.
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: int, event_types: int, event_set: str) -> None:
        assert event_types == nvmlEventTypeXidCriticalError and event_set == "event-set"
        if self.reading["gpus"][h].get("xid_events") is False:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED, "Not Supported")
        self.registered.add(h)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        try:
            gpu, xid = self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT, "Timeout") from None
        return SimpleNamespace(
            device=gpu, eventType=nvmlEventTypeXidCriticalError, eventData=xid,
            gpuInstanceId=0, computeInstanceId=0,
        )  # fmt: skip

    def nvmlEventSetFree(self, event_set: str) -> None:
        assert event_set == "event-set"


def main(argv: list[str]) -> None:
    """``--fixture F | --no-driver [--xid GPU:XID ...] [--lost GPU ...] -- <ruleloop args>``."""
    import argparse

    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m tests.fakes.nvml")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--fixture", type=Path)
    source.add_argument("--no-driver", action="store_true")
    parser.add_argument("--xid", action="append", default=[], help="GPU:XID raised at start")
    parser.add_argument("--lost", action="append", type=int, default=[], help="a lost GPU")
    args = parser.parse_args(argv[:split])
    fake = FakeNvml.no_driver() if args.no_driver else FakeNvml.from_file(args.fixture)
    fake.lost.update(args.lost)
    for pair in args.xid:
        gpu, xid = pair.split(":")
        fake.raise_xid(int(gpu), int(xid))
    sys.modules["pynvml"] = fake  # type: ignore[assignment]
    from bot.app.cli import cli

    cli.main(argv[split + 1 :], prog_name="ruleloop")


if __name__ == "__main__":
    main(sys.argv[1:])
