"""The shipped deploy files: alert rules pass `promtool test rules`, configs check, all agree."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from bot.runbooks.builtin import default_registry
from bot.runbooks.loader import load_dir
from bot.slack.listeners import commands

ROOT = Path(__file__).parent.parent
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "vllm-alerts.rules.yml"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(
            f"{name} is not installed (`make test` installs prometheus and prometheus-alertmanager)"
        )
    return path


def run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)


def alert_names() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"]]


def test_promtool_unit_tests_pass() -> None:
    result = run(tool("promtool"), "test", "rules", "vllm-alerts.test.yml", cwd=RULES.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_test_fails_on_a_wrong_expectation(tmp_path: Path) -> None:
    shutil.copy(RULES, tmp_path)
    test = (RULES.parent / "vllm-alerts.test.yml").read_text()
    (tmp_path / "t.yml").write_text(test.replace("2.483s", "9.999s"))
    result = run(tool("promtool"), "test", "rules", "t.yml", cwd=tmp_path)
    assert result.returncode == 1 and "9.999s" in result.stdout + result.stderr


def test_example_configs_check() -> None:
    prometheus = run(tool("promtool"), "check", "config", "prometheus.yml", cwd=RULES.parent)
    assert prometheus.returncode == 0, prometheus.stdout + prometheus.stderr
    alertmanager = run(
        tool("amtool"), "check-config", "alertmanager.yml", cwd=DEPLOY / "alertmanager"
    )
    assert alertmanager.returncode == 0, alertmanager.stdout + alertmanager.stderr


def test_every_shipped_alert_has_the_latency_runbook() -> None:
    runbooks = load_dir(ROOT / "runbooks", default_registry())
    names = alert_names()
    assert len(names) == 5
    for name in names:
        chosen = runbooks.select({"alertname": name})
        assert chosen is not None and chosen.name == "vllm-latency", name


def test_alertmanager_routes_vllm_alerts_to_the_webhook_with_a_token() -> None:
    config = yaml.safe_load((DEPLOY / "alertmanager" / "alertmanager.yml").read_text())
    (route,) = config["route"]["routes"]
    receiver = next(r for r in config["receivers"] if r["name"] == route["receiver"])
    (hook,) = receiver["webhook_configs"]
    assert hook["url"].endswith("/alertmanager") and hook["send_resolved"] is True
    assert hook["http_config"]["authorization"]["type"] == "Bearer"


def test_slack_manifest_matches_the_app() -> None:
    manifest = yaml.safe_load((DEPLOY / "slack" / "manifest.yml").read_text())
    (command,) = [c for c in manifest["features"]["slash_commands"] if c["command"] == "/diagnose"]
    assert command["url"].endswith("/slack/events")
    assert manifest["settings"]["interactivity"]["request_url"].endswith("/slack/events")
    assert {"chat:write", "commands", "files:write"} <= set(
        manifest["oauth_config"]["scopes"]["bot"]
    )
    assert '"/diagnose"' in Path(commands.__file__).read_text()
