"""`ruleloop serve` through click's runner, and once as a real process."""

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
from bot.engine.process import free_port
from tests.fakes.alerts import alert, body
from tests.fakes.bot import PAGES, RUNBOOK
from tests.fakes.metrics_server import RecordedMetrics

ROOT = Path(__file__).parent.parent


def config(
    tmp_path: Path, *, vllm_url: str = "http://127.0.0.1:1", runbooks: Path | None = None
) -> Path:
    if runbooks is None:
        runbooks = tmp_path / "runbooks"
        runbooks.mkdir()
        (runbooks / "test.yaml").write_text(RUNBOOK)
    path = tmp_path / "ruleloop.toml"
    path.write_text(
        f'[paths]\nrunbooks = "{runbooks}"\nadr = "{ROOT / "adr"}"\n'
        f'[targets.prod-a]\nvllm_url = "{vllm_url}"\n'
    )
    return path


def test_serve_help() -> None:
    result = CliRunner().invoke(cli, ["serve", "--help"])
    assert result.exit_code == 0
    assert "RULELOOP_ALERTMANAGER_TOKEN" in result.output and "console transport" in result.output


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: p.write_text("[slack\n"), "is not valid TOML"),
        (lambda p: p.write_text("[server]\nport = 99999\n"), "server.port"),
        (
            lambda p: p.write_text('[paths]\nrunbooks = "/nonexistent"\n'),
            "runbook directory /nonexistent does not exist",
        ),
    ],
)
def test_serve_bad_configuration_exits_2(tmp_path: Path, setup, message: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bad.toml"
    setup(path)
    result = CliRunner().invoke(
        cli, ["serve", "--config", str(path), "--port", "0", "--state-dir", str(tmp_path)]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_serve_busy_port_exits_2(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(
            cli, ["serve", "--config", str(config(tmp_path)), "--port", str(port)]
        )
    assert result.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}" in result.output


def test_serve_process_console_transport(tmp_path: Path) -> None:
    port = free_port()
    with RecordedMetrics(PAGES) as engine:
        env = {
            **os.environ,
            "RULELOOP_ALERTMANAGER_TOKEN": "tok-0123456789abcdef",
            "RULELOOP_CONFIG": str(config(tmp_path, vllm_url=engine.base_url)),
        }
        for var in ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_APP_TOKEN"):
            env.pop(var, None)
        proc = subprocess.Popen(
            [sys.executable, "-c", "from bot.app.cli import main; main()", "serve", "--port", str(port), "--state-dir", str(tmp_path / "state")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{url}/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, "serve did not start"
                time.sleep(0.3)
            headers = {
                "Authorization": "Bearer tok-0123456789abcdef",
                "Content-Type": "application/json",
            }
            instance = engine.base_url.removeprefix("http://")
            response = httpx.post(
                f"{url}/alertmanager", content=body(alert(instance=instance)), headers=headers
            )
            assert response.status_code == 202
            while (
                "Goodput" not in (metrics := httpx.get(f"{url}/metrics").text)
                and "posted" not in metrics
            ):
                assert time.monotonic() < deadline, "no diagnosis"
                time.sleep(0.3)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert f"ruleloop serve: http://127.0.0.1:{port} (transport: console; targets: prod-a)" in out
    assert "VLLMTimeToFirstTokenP99High | firing, diagnosed" in out and "Goodput: 99.5 %" in out
    assert engine.scrapes >= 3
