"""The shipped deploy files: alert rules pass `promtool test rules` (every alert has cases both
ways, labels and a runbook section), configs check, all agree."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from bot.diagnosis.runbooks.builtin import default_registry
from bot.diagnosis.runbooks.loader import load_dir
from bot.surfaces.slack.listeners import commands

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


LATENCY_ALERTS = ["VLLMTimeToFirstTokenP99High", "VLLMQueueTimeP99High", "VLLMKVCacheUsageHigh",
                  "VLLMPreemptions", "VLLMWastedPrefillHigh"]  # fmt: skip
ENGINE_ALERTS = ["VLLMEngineDown", "VLLMEngineAbsent"]


def test_every_shipped_alert_has_a_runbook() -> None:
    """Latency alerts get the latency runbook; an engine that is down, the default one (its
    probes say the engine does not answer, which is the finding)."""
    runbooks = load_dir(ROOT / "runbooks", default_registry())
    assert alert_names() == LATENCY_ALERTS + ENGINE_ALERTS
    for name in alert_names():
        chosen = runbooks.select({"alertname": name})
        expected = "vllm-latency" if name in LATENCY_ALERTS else "default"
        assert chosen is not None and chosen.name == expected, name


# --- every alert is tested, labelled and documented --------------------------------------------

ALERTS_DOC = ROOT / "docs" / "alerts.md"


def rules_of(rules_text: str) -> list[dict]:
    return [rule for group in yaml.safe_load(rules_text)["groups"] for rule in group["rules"]]


def untested_alerts(rules_text: str, tests_text: str) -> list[str]:
    """Alerts without a promtool case that fires them and one that must not fire."""
    cases = [case for test in yaml.safe_load(tests_text)["tests"]
             for case in test.get("alert_rule_test", [])]  # fmt: skip
    problems = []
    for rule in rules_of(rules_text):
        name = rule["alert"]
        mine = [case for case in cases if case["alertname"] == name]
        if not any(case.get("exp_alerts") for case in mine):
            problems.append(f"{name}: no promtool case where it fires (vllm-alerts.test.yml)")
        if not any(not case.get("exp_alerts") for case in mine):
            problems.append(f"{name}: no promtool case where it must not fire (exp_alerts: [])")
    return problems


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    kept = "".join(c for c in heading.strip().lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def label_problems(rules_text: str, doc_text: str) -> list[str]:
    """Alerts without severity critical|warning, a description, or a runbook_url that exists."""
    anchors = {github_anchor(line.lstrip("#")) for line in doc_text.splitlines()
               if line.startswith("#")}  # fmt: skip
    problems = []
    for rule in rules_of(rules_text):
        name, annotations = rule["alert"], rule.get("annotations", {})
        if rule.get("labels", {}).get("severity") not in ("critical", "warning"):
            problems.append(f"{name}: severity must be critical or warning")
        for key in ("summary", "description", "runbook_url"):
            if not str(annotations.get(key, "")).strip():
                problems.append(f"{name}: no {key} annotation")
        page, _, anchor = str(annotations.get("runbook_url", "")).partition("#")
        if page != "docs/alerts.md" or anchor not in anchors:
            problems.append(f"{name}: runbook_url {annotations.get('runbook_url')!r} is not a "
                            f"section of docs/alerts.md")  # fmt: skip
    return problems


def test_every_alert_has_promtool_cases_both_ways() -> None:
    tests = (RULES.parent / "vllm-alerts.test.yml").read_text()
    assert untested_alerts(RULES.read_text(), tests) == []


def test_every_alert_is_labelled_and_has_its_runbook_section() -> None:
    assert label_problems(RULES.read_text(), ALERTS_DOC.read_text()) == []


NEW_RULE = """
      - alert: VLLMNew
        expr: vllm:num_requests_waiting > 100
        labels: {severity: page}
        annotations:
          summary: new
          runbook_url: docs/alerts.md#vllmnew
"""


def test_alert_checks_find_a_new_rule_without_tests_labels_or_docs() -> None:
    rules = RULES.read_text().replace("\n  - name: vllm-engine", NEW_RULE + "  - name: vllm-engine")
    assert "VLLMNew" in rules
    tests = (RULES.parent / "vllm-alerts.test.yml").read_text()
    assert untested_alerts(rules, tests) == [
        "VLLMNew: no promtool case where it fires (vllm-alerts.test.yml)",
        "VLLMNew: no promtool case where it must not fire (exp_alerts: [])",
    ]
    assert label_problems(rules, ALERTS_DOC.read_text()) == [
        "VLLMNew: severity must be critical or warning",
        "VLLMNew: no description annotation",
        "VLLMNew: runbook_url 'docs/alerts.md#vllmnew' is not a section of docs/alerts.md",
    ]
    # a case that only checks silence is not a test that it fires
    only_silent = tests + (
        "  - interval: 1m\n    input_series: []\n    alert_rule_test:\n"
        "      - {eval_time: 1m, alertname: VLLMNew, exp_alerts: []}\n"
    )
    assert untested_alerts(rules, only_silent) == [
        "VLLMNew: no promtool case where it fires (vllm-alerts.test.yml)"
    ]


def test_alertmanager_routes_vllm_alerts_to_the_webhook_with_a_token() -> None:
    config = yaml.safe_load((DEPLOY / "alertmanager" / "alertmanager.yml").read_text())
    route = config["route"]["routes"][0]  # the bot's route first (continue: true), then the pager's
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
