"""The engine's CPU limit: a cgroup quota that really throttles, refused clearly where it cannot."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from bot.app.cli import cli
from bot.engine.cpu_limit import CGROUP_ROOT, ENV_VAR, CpuLimit, cores_from_environment
from bot.engine.process import EngineManager, free_port, session_pids
from bot.kernel.errors import EngineError

WRITABLE = os.access(CGROUP_ROOT / "cpu", os.W_OK) or os.access(CGROUP_ROOT, os.W_OK)


def throttled(limit: CpuLimit) -> int:
    """How many periods the group ran out of quota in (cpu.stat): proof the limit bites."""
    for line in (limit.group / "cpu.stat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "nr_throttled":
            return int(value)
    return 0


@pytest.mark.skipif(not WRITABLE, reason="needs a writable cgroup cpu controller (root)")
def test_a_busy_process_under_the_limit_is_throttled() -> None:
    limit = CpuLimit(cores=0.1, name=f"ruleloop-test-{os.getpid()}")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # noqa: S603
    try:
        limit.apply(busy.pid)
        assert str(busy.pid) in (limit.group / "cgroup.procs").read_text().split()
        deadline = time.monotonic() + 30
        while throttled(limit) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)  # a tenth of a core runs out within a period or two
        assert throttled(limit) > 0
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


@pytest.mark.parametrize(
    ("value", "cores"), [(None, None), ("", None), ("0.1", 0.1), (" 2 ", 2.0), ("1024", 1024.0)]
)
def test_the_switch_reads_cores_from_the_environment(
    value: str | None, cores: float | None
) -> None:
    environ = {} if value is None else {ENV_VAR: value}
    assert cores_from_environment(environ) == cores


@pytest.mark.parametrize("value", ["fast", "0", "-1", "nan", "2000", "0.001"])
def test_a_bad_switch_says_what_was_wrong_and_what_to_set(value: str) -> None:
    with pytest.raises(EngineError) as caught:
        cores_from_environment({ENV_VAR: value})
    assert f"{ENV_VAR}={value!r} is not a number of cores from 0.01 to 1024" in str(caught.value)
    assert "e.g. 0.1" in str(caught.value) and "unset it" in str(caught.value)


def test_every_engine_manager_honours_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "0.1")
    assert EngineManager(state_dir=Path("/nonexistent")).cpu_limit == 0.1
    assert EngineManager(state_dir=Path("/nonexistent"), cpu_limit=0.5).cpu_limit == 0.5
    monkeypatch.delenv(ENV_VAR)
    assert EngineManager(state_dir=Path("/nonexistent")).cpu_limit is None


@pytest.mark.parametrize("command", [["engine", "up"], ["demo"]])
def test_the_commands_refuse_a_bad_switch_before_starting_anything(
    command: list[str], tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        cli, command, env={ENV_VAR: "fast", "RULELOOP_STATE_DIR": str(tmp_path)}
    )
    assert result.exit_code == 2 and "'fast' is not a valid float range" in result.output
    assert not list(tmp_path.iterdir()), "something was started or written"


@pytest.mark.engine
@pytest.mark.skipif(not WRITABLE, reason="needs a writable cgroup cpu controller (root)")
def test_a_limited_engine_serves_with_every_process_in_the_group(tmp_path: Path) -> None:
    """The quota bites once the engine serves: the API server and the engine core both in the
    group, and a request's decode runs out of quota (proof the switch slows serving)."""
    manager = EngineManager(state_dir=tmp_path, cpu_limit=0.1)
    info = manager.start(port=free_port(), flags=["--enforce-eager"], timeout_s=600)
    limit = CpuLimit(cores=0.1, name=f"ruleloop-engine-{info.port}")
    try:
        pids = session_pids(info.pid)
        assert len(pids) >= 2 and pids[0] == info.pid  # the server and vLLM's engine core
        grouped = (limit.group / "cgroup.procs").read_text().split()
        assert all(str(pid) in grouped for pid in pids), (pids, grouped)
        before = throttled(limit)
        body = {"model": info.model, "prompt": "slow " * 50, "max_tokens": 32, "ignore_eos": True}
        response = httpx.post(f"{info.base_url}/v1/completions", json=body, timeout=600)
        assert response.status_code == 200
        assert throttled(limit) > before
    finally:
        manager.stop(info.port)
    assert not limit.group.exists()
