"""The reaper of a killed run's processes stops orphans and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys

from tests import orphans

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_process_whose_owner_is_gone_is_killed_and_one_whose_owner_lives_is_not() -> None:
    orphan = subprocess.Popen(SLEEP, env={**os.environ, orphans.OWNER_ENV: str(dead_pid())})
    owned = subprocess.Popen(SLEEP, env={**os.environ, orphans.OWNER_ENV: str(os.getpid())})
    unmarked = subprocess.Popen(SLEEP, env={k: v for k, v in os.environ.items()
                                            if k != orphans.OWNER_ENV})  # fmt: skip
    try:
        killed = orphans.reap()
        assert orphan.pid in killed
        assert orphan.wait(timeout=10) == -9
        assert owned.poll() is None and unmarked.poll() is None
        assert owned.pid not in killed and unmarked.pid not in killed
    finally:
        for proc in (orphan, owned, unmarked):
            proc.kill()
            proc.wait()
