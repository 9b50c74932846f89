"""`ruleloop engine up|status|down` and `ruleloop demo` (the README's main job) end to end."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from bot.cli import cli
from bot.engine.process import free_port

pytestmark = pytest.mark.engine


def invoke(args: list[str], state_dir: Path):
    env = {"RULELOOP_STATE_DIR": str(state_dir)}
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


def test_engine_up_status_down(tmp_path: Path) -> None:
    port = free_port()
    up = invoke(
        ["engine", "up", "--port", str(port), "--", "--enforce-eager", "--max-num-seqs", "8"],
        tmp_path,
    )
    try:
        assert up.exit_code == 0, up.output
        assert f"vLLM serving at http://127.0.0.1:{port}" in up.stdout
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        status = invoke(["engine", "status"], tmp_path)
        assert f"port {port}" in status.stdout and "--max-num-seqs 8" in status.stdout
        again = invoke(["engine", "up", "--port", str(port)], tmp_path)
        assert again.exit_code == 2 and "already running" in again.stderr
    finally:
        down = invoke(["engine", "down", "--port", str(port)], tmp_path)
    assert down.exit_code == 0 and f"stopped vLLM on port {port}" in down.stdout
    assert "no engine running" in invoke(["engine", "status"], tmp_path).stdout


def test_engine_up_with_flags_vllm_refuses_exits_2_with_its_reason(tmp_path: Path) -> None:
    result = invoke(
        ["engine", "up", "--port", str(free_port()), "--", "--enforce-eager", "--no-such-flag"],
        tmp_path,
    )
    assert result.exit_code == 2
    assert "unrecognized arguments: --no-such-flag" in result.stderr
    assert "Traceback" not in result.output


def test_demo_prints_the_four_metric_baseline_and_stops_its_engine(tmp_path: Path) -> None:
    result = invoke(
        [
            "demo",
            "--num-requests",
            "8",
            "--concurrency",
            "4",
            "--prompt-length",
            "64",
            "--output-length",
            "16",
        ],
        tmp_path,
    )
    assert result.exit_code == 0, result.output
    for row in ("TTFT p99", "TPOT p99", "goodput ratio", "KV frag. (observed)", "requests: 8 ok"):
        assert row in result.stdout
    assert not list(tmp_path.glob("engine-*.json")), "demo left its engine running"
    assert os.environ.get("RULELOOP_STATE_DIR") != str(tmp_path)
