"""Processes for bench/gateway_bench.py: the gateway, LiteLLM's proxy, and CPU accounting.

CPU seconds are read from /proc (user + system, a process and its live children), so each proxy
is charged for its own work only; ``busy_seconds`` is the whole box, so that the bench can say
how much CPU other people's jobs took during each run (this box is shared).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its live children."""
    total = 0.0
    for p in [pid, *children(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def children(pid: int) -> list[int]:
    """All descendants of a process."""
    try:
        kids = [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return kids + [g for k in kids for g in children(k)]


def busy_seconds() -> float:
    """CPU seconds the whole box has spent busy since boot (all cores, from /proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / CLK_TCK


def quiesce(pids: list[int], *, below_s: float = 0.05, timeout_s: float = 120.0) -> float:
    """Wait until these processes use under ``below_s`` CPU per second; return seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        before = sum(cpu_seconds(p) for p in pids)
        time.sleep(1.0)
        if sum(cpu_seconds(p) for p in pids) - before < below_s:
            break
    return time.monotonic() - started


def start_gateway(
    upstream: str, port: int, log: Path, *, prelude: str = ""
) -> subprocess.Popen[bytes]:
    """`ruleloop gateway` in its own process, with a budget large enough never to refuse.

    ``prelude`` is Python run first in that process (e.g. ``import _aiohttp_upstream``).
    """
    code = prelude + "from bot.app.cli import main; main()"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "bench"), str(ROOT)]))
    argv = [sys.executable, "-c", code, "gateway",
            "--upstream", upstream, "--listen", f"127.0.0.1:{port}",
            "--max-inflight-tokens", "10000000", "--default-timeout", "600s"]  # fmt: skip
    return subprocess.Popen(  # noqa: S603
        argv, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )


def start_litellm(litellm: str, upstream: str, port: int, tmp: Path) -> subprocess.Popen[bytes]:
    """LiteLLM's proxy (own venv), one model: hosted_vllm/tiny-llama at the engine's /v1."""
    config = tmp / "litellm.yaml"
    config.write_text(
        "model_list:\n  - model_name: tiny-llama\n    litellm_params:\n"
        f"      model: hosted_vllm/tiny-llama\n      api_base: {upstream}/v1\n"
    )
    env = dict(os.environ, LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY="true",
               LITELLM_LOG="ERROR", LITELLM_TELEMETRY="False")  # fmt: skip
    argv = [litellm, "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
            "--num_workers", "1"]  # fmt: skip
    log = (tmp / "litellm.log").open("wb")
    return subprocess.Popen(argv, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603


def wait_ready(url: str, proc: subprocess.Popen[bytes], name: str, timeout_s: float = 300) -> None:
    """Poll ``url`` until it answers 200; stop the bench if the process dies first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with code {proc.returncode} before serving")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{name} did not serve {url} within {timeout_s:.0f} s")


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate, then kill what does not stop."""
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
