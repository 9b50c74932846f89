"""`ruleloop gateway` through click's runner (usage errors) and as a real process (SIGHUP)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from bot.app.cli import cli
from bot.diagnosis.probes.exposition import Exposition
from bot.engine.process import free_port


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--upstream", "localhost:8000"], "must be an http(s) URL"),
        (["--upstream", "http://e", "--listen", "nowhere"], "must be HOST:PORT"),
        (["--upstream", "http://e", "--default-timeout", "soon"], "--default-timeout 'soon'"),
        (["--upstream", "http://e", "--default-timeout", "2h"], "--default-timeout"),
        (["--upstream", "http://e", "--default-timeout", "90", "--max-timeout", "60"], "above"),
        (["--upstream", "http://e", "--max-inflight-tokens", "-3"], "-3"),
    ],
)
def test_gateway_cli_refuses_bad_flags_with_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["gateway", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_gateway_cli_refuses_a_bad_limits_file(tmp_path: Path) -> None:
    limits = tmp_path / "limits.yaml"
    limits.write_text("max_inflight_tokens: lots\n")
    result = CliRunner().invoke(
        cli, ["gateway", "--upstream", "http://e", "--limits-file", str(limits)]
    )
    assert result.exit_code == 2 and "max_inflight_tokens" in result.output


def test_gateway_cli_help_documents_timeout_units() -> None:
    result = CliRunner().invoke(cli, ["gateway", "--help"])
    assert result.exit_code == 0
    assert "500ms = milliseconds" in result.output and "--max-inflight-tokens" in result.output


def _max_inflight(base: str) -> float | None:
    page = Exposition.parse(httpx.get(f"{base}/metrics").text, at=0.0)
    return page.total("ruleloop_gateway_max_inflight_tokens")


def test_gateway_process_reloads_limits_on_sighup_and_stops_on_sigterm(tmp_path: Path) -> None:
    limits = tmp_path / "limits.yaml"
    limits.write_text("max_inflight_tokens: 1000\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-c", "from bot.app.cli import main; main()", "gateway", "--upstream", f"http://127.0.0.1:{free_port()}",
            "--listen", f"127.0.0.1:{port}", "--limits-file", str(limits)]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)  # noqa: S603
    try:
        while True:
            try:
                assert _max_inflight(base) == 1000
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.1)
        limits.write_text("max_inflight_tokens: 2500\n")
        os.kill(proc.pid, signal.SIGHUP)
        while _max_inflight(base) != 2500:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stderr:
            proc.stderr.close()


def test_gateway_cli_reports_a_busy_port_with_exit_2() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(
            cli, ["gateway", "--upstream", "http://127.0.0.1:1", "--listen", f"127.0.0.1:{port}"]
        )
    assert result.exit_code == 2 and "cannot listen on" in result.output
