"""The agent's hold on NVML: initialised once (retried while it fails), read under one lock.

NVML calls block, so the app calls ``snapshot`` in a worker thread; the lock keeps two requests
from interleaving NVML calls. The XID watcher starts with the first successful initialisation.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from bot.agent.reading import SCHEMA, NvmlUnavailable, import_pynvml, nvml_init, read_snapshot
from bot.agent.xid import XidWatcher


class NvmlSession:
    """Takes snapshots of this host's GPUs; says why not when NVML is missing or failing."""

    def __init__(
        self, nvml: Any | None = None, *, hostname: str | None = None,
        wall_clock: Callable[[], float] = time.time, watch_xid: bool = True,
    ) -> None:  # fmt: skip
        self._nvml = nvml
        self.hostname = hostname or socket.gethostname()
        self._clock = wall_clock
        self._watch_xid = watch_xid
        self._lock = threading.Lock()
        self._ready = False
        self._watcher: XidWatcher | None = None
        self.last_error: NvmlUnavailable | None = None

    def _module(self) -> Any:
        if self._nvml is None:
            self._nvml = import_pynvml()
        if self._nvml is None:
            raise NvmlUnavailable(
                "nvidia-ml-py is not installed (pip install nvidia-ml-py)", code="nvml_unavailable"
            )
        return self._nvml

    def _open(self) -> Any:
        nvml = self._module()
        if not self._ready:
            nvml_init(nvml)
            self._ready = True
            if self._watch_xid:
                self._watcher = XidWatcher(nvml, wall_clock=self._clock)
                try:
                    count = nvml.nvmlDeviceGetCount()
                except nvml.NVMLError as exc:
                    raise NvmlUnavailable(
                        f"NVML failed while counting GPUs: {exc}", code="nvml_error"
                    ) from None
                self._watcher.start(count)
        return nvml

    def snapshot(self, *, max_processes: int) -> dict[str, Any]:
        """One snapshot of every GPU (blocking); NvmlUnavailable says why there is none."""
        with self._lock:
            try:
                nvml = self._open()
                reading = read_snapshot(nvml, max_processes=max_processes)
            except NvmlUnavailable as exc:
                self.last_error = exc
                raise
            self.last_error = None
            for gpu in reading["gpus"]:
                gpu["xid"] = None if self._watcher is None else self._watcher.for_gpu(gpu["index"])
            taken = dt.datetime.fromtimestamp(self._clock(), dt.UTC)
            return {
                "schema": SCHEMA,
                "host": self.hostname,
                "taken_at": taken.isoformat(timespec="milliseconds"),
                **reading,
            }

    def status(self) -> str:
        """'ok', 'not read yet' or why the last reading failed (for /healthz)."""
        if self.last_error is not None:
            return f"{self.last_error.code}: {self.last_error}"
        return "ok" if self._ready else "not read yet"

    def close(self) -> None:
        """Stop the XID watcher and shut NVML down."""
        with self._lock:
            if self._watcher is not None:
                self._watcher.stop()
                self._watcher = None
            if self._ready and self._nvml is not None:
                with contextlib.suppress(self._nvml.NVMLError):
                    self._nvml.nvmlShutdown()
                self._ready = False
