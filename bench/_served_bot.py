"""A real `ruleloop serve` process for the benches that flood it, and its resident memory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

TOKEN = "bench-token-0123456789abcdef0123"  # the Alertmanager bearer token it is started with


def rss_kib(pid: int) -> int:
    """The process's resident memory (VmRSS), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@contextmanager
def served(state_dir: str, *, base_port: int) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`ruleloop serve` on a SQLite store in ``state_dir``, once /livez answers: (process, URL)."""
    port = base_port + os.getpid() % 1000
    env = {**os.environ, "RULELOOP_ALERTMANAGER_TOKEN": TOKEN,
           "RULELOOP_DATABASE_URL": f"sqlite:///{state_dir}/ruleloop.db"}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-c", "from bot.app.cli import main; main()", "serve", "--port",
         str(port), "--state-dir", state_dir],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/livez", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        time.sleep(1.0)
        yield proc, url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
