"""XID errors: NVML hands them out only as events, so a thread waits for them and keeps count.

NVML has no "XID errors so far" query: a process registers for ``nvmlEventTypeXidCriticalError``
and sees the XIDs raised while it listens. The agent's snapshot therefore says, per GPU, whether
XID events could be registered, how many arrived since the agent started, and the last few.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger("ruleloop.agent")

XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
TIMEOUT = 10  # NVML_ERROR_TIMEOUT: the wait ended without an event


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="seconds")


class XidWatcher:
    """Counts XID events per GPU index from ``start()`` until ``stop()``."""

    def __init__(
        self, nvml: Any, *, wait_ms: int = 500, keep: int = 10,
        wall_clock: Callable[[], float] | None = None,
    ) -> None:  # fmt: skip
        self._nvml = nvml
        self._wait_ms = wait_ms
        self._keep = keep
        self._clock = wall_clock or time.time
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._since = self._clock()
        self._registered: dict[int, str | None] = {}  # index -> None (listening) or why not
        self._counts: dict[int, int] = {}
        self._recent: dict[int, deque[dict[str, Any]]] = {}
        self._failure: str | None = None

    def start(self, gpu_count: int) -> None:
        """Register every GPU for XID events (NVML initialised) and start listening."""
        nvml = self._nvml
        self._since = self._clock()
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except (nvml.NVMLError, AttributeError) as exc:
            self._failure = f"NVML events unavailable: {exc}"
            return
        for index in range(gpu_count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, XID_EVENT, self._event_set)
                self._registered[index] = None
            except nvml.NVMLError as exc:
                self._registered[index] = str(exc) or type(exc).__name__
        if any(why is None for why in self._registered.values()):
            self._thread = threading.Thread(target=self._listen, name="xid-watcher", daemon=True)
            self._thread.start()

    def _listen(self) -> None:
        nvml = self._nvml
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(self._event_set, self._wait_ms)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == TIMEOUT:
                    continue
                with self._lock:
                    self._failure = f"stopped listening for XID events: {exc}"
                log.warning("XID watcher: %s", exc)
                return
            if not data.eventType & XID_EVENT:
                continue
            try:
                index = int(nvml.nvmlDeviceGetIndex(data.device))
            except nvml.NVMLError:
                index = -1  # the event's GPU could not be named; still counted
            self._record(index, int(data.eventData))

    def _record(self, index: int, xid: int) -> None:
        with self._lock:
            self._counts[index] = self._counts.get(index, 0) + 1
            recent = self._recent.setdefault(index, deque(maxlen=self._keep))
            recent.append({"xid": xid, "at": _iso(self._clock())})
        log.warning("XID %d on GPU %d", xid, index)

    def for_gpu(self, index: int) -> dict[str, Any]:
        """What the snapshot says about one GPU's XID errors."""
        with self._lock:
            registered = index in self._registered and self._registered[index] is None
            listening = self._failure is None and registered
            why_not = self._failure or self._registered.get(index) or "not registered"
            return {
                "watching": listening,
                "why_not": None if listening else why_not,
                "since": _iso(self._since),
                "count": self._counts.get(index, 0),
                "recent": list(self._recent.get(index, ())),
            }

    def stop(self) -> None:
        """Stop listening and free the event set (NVML still initialised)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._wait_ms / 1000 + 5)
        if self._event_set is not None:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
