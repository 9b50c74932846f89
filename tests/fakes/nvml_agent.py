"""A real `ruleloop agent` process on loopback, its NVML the fake one (tests/fakes/nvml.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from bot.engine.process import free_port

ROOT = Path(__file__).parent.parent.parent
TOKEN = "agent-token-0123456789abcdef"


@dataclass
class AgentProcess:
    """A started agent: where it serves, its token file, the process."""

    url: str
    token_file: Path
    process: subprocess.Popen[str]


@contextlib.contextmanager
def running_agent(
    tmp_path: Path, *fake: str, agent_args: tuple[str, ...] = (), token: str = TOKEN,
    host: str = "127.0.0.1", port: int | None = None, env: dict[str, str] | None = None,
) -> Iterator[AgentProcess]:  # fmt: skip
    """Start ``python -m tests.fakes.nvml <fake> -- agent ...`` on ``host`` (a loopback
    address: one per node of a DaemonSet) and ``port`` (unset: a free one), with ``env`` over
    this process's environment; wait for /healthz; stop it."""
    token_file = tmp_path / "agent-token"
    token_file.write_text(token + "\n")
    port = port or free_port()
    argv = [sys.executable, "-m", "tests.fakes.nvml", *fake, "--", "agent",
            "--listen", f"{host}:{port}", "--token-file", str(token_file), *agent_args]  # fmt: skip
    process = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    url = f"http://{host}:{port}"
    try:
        _wait_ready(url, process)
        yield AgentProcess(url=url, token_file=token_file, process=process)
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(timeout=30)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def _wait_ready(url: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60  # a bound for a loaded box, not a measurement
    while time.monotonic() < deadline:
        if process.poll() is not None:
            _, err = process.communicate()
            raise AssertionError(f"the agent exited {process.returncode}: {err}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"the agent at {url} did not serve /healthz within 60 s")
