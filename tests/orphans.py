"""Engines and servers left by a test run that was killed: found and stopped by the next run.

A test's engine runs in its own session so that it outlives the command that started it (as
`ruleloop engine up` needs); when pytest itself is killed (SIGKILL, an OOM, a CI timeout) nothing
stops them, and a few orphaned engines of ~2 GB each starve the next run of memory. Every process
a test run starts inherits OWNER_ENV, the pid of the pytest process that started it; a process
whose owner is gone is an orphan.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from bot.kernel.runtime.ids import process_alive

OWNER_ENV = "RULELOOP_TEST_OWNER_PID"
CGROUPS = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup"))


def mark_owner() -> None:
    """Make this process the owner of everything it starts from now on."""
    os.environ[OWNER_ENV] = str(os.getpid())


def reap() -> list[int]:
    """Kill every process whose owning test run is gone; remove empty engine CPU groups.
    Returns the pids killed."""
    killed = []
    marker = f"{OWNER_ENV}=".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        owner = next((v[len(marker) :] for v in environ.split(b"\0") if v.startswith(marker)), None)
        if owner is None or not owner.isdigit() or process_alive(int(owner)):
            continue
        try:
            os.kill(int(entry.name), signal.SIGKILL)
            killed.append(int(entry.name))
        except OSError:
            continue
    for root in CGROUPS:
        for group in root.glob("ruleloop-*"):
            try:
                group.rmdir()  # refused while a process is still in it: then it is in use
            except OSError:
                continue
    return killed
