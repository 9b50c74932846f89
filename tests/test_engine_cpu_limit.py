"""The engine's CPU limit: a cgroup quota that really throttles, refused clearly where it cannot."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bot.engine.cpu_limit import CGROUP_ROOT, CpuLimit
from bot.errors import EngineError

WRITABLE = os.access(CGROUP_ROOT / "cpu", os.W_OK) or os.access(CGROUP_ROOT, os.W_OK)


@pytest.mark.skipif(not WRITABLE, reason="needs a writable cgroup cpu controller (root)")
def test_a_busy_process_under_the_limit_is_throttled() -> None:
    limit = CpuLimit(cores=0.1, name=f"ruleloop-test-{os.getpid()}")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # noqa: S603
    try:
        limit.apply(busy.pid)
        assert str(busy.pid) in (limit.group / "cgroup.procs").read_text().split()
        deadline = time.monotonic() + 30
        while limit.throttled() == 0 and time.monotonic() < deadline:
            time.sleep(0.2)  # a tenth of a core runs out within a period or two
        assert limit.throttled() > 0
    finally:
        busy.kill()
        busy.wait()
        limit.remove()
    assert not limit.group.exists()


def test_a_limit_that_cannot_be_set_says_why_and_what_to_do() -> None:
    limit = CpuLimit(cores=0.25, name="x", root=Path("/proc"))  # no cgroup can be made there
    with pytest.raises(EngineError) as caught:
        limit.apply(os.getpid())
    assert "cannot limit the engine to 0.25 cores" in str(caught.value)
    assert "run as root, or without the limit" in str(caught.value)
    with pytest.raises(EngineError, match="0.01 to 1024 cores"):
        CpuLimit(cores=0, name="x")
