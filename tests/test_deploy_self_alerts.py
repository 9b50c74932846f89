"""The bot watches itself: deploy/prometheus/ruleloop-alerts.rules.yml passes `promtool test
rules` (every alert with a case both ways, labelled, with its section in docs/alerts.md), reads
only metrics the real bot serves, and ships as the PrometheusRule `ruleloop-alerts`, in the
plain rules ConfigMap and in prometheus.yml's rule_files."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.fakes.alerts import alert, body
from tests.fakes.bot import harness
from tests.fakes.slack_api import FakeSlack
from tests.kustomize_render import KUBERNETES, ROOT, by_kind, kustomize
from tests.test_bot_deploy import ALERTS_DOC, label_problems, untested_alerts
from tests.test_deploy_operator import generator

pytestmark = pytest.mark.faults

PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "ruleloop-alerts.rules.yml"
TESTS = PROMETHEUS / "ruleloop-alerts.test.yml"
PROMETHEUSRULE = KUBERNETES / "components" / "operator" / "prometheusrule-ruleloop.yaml"
SELF_ALERTS = ["RuleloopDown", "RuleloopStoreDown", "RuleloopSlackDeliveriesFailing",
               "RuleloopOutboxBacklog", "RuleloopRollbackFailed", "RuleloopShedding",
               "RuleloopScheduledJobFailing", "RuleloopScheduledJobLagging"]  # fmt: skip


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (`make test` installs prometheus)")
    return path


def promtool_test(directory: Path, test: str = TESTS.name) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), "test", "rules", test], cwd=directory,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def names(rules_text: str) -> list[str]:
    groups = yaml.safe_load(rules_text)["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"]]


def test_the_bot_has_alerts_for_itself() -> None:
    assert names(RULES.read_text()) == SELF_ALERTS


def test_promtool_unit_tests_pass() -> None:
    result = promtool_test(PROMETHEUS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # the bot down: one replica left is enough to stay quiet
        ("sum by (job) (up{job=\"ruleloop\"}) == 0", "min by (job) (up{job=\"ruleloop\"}) == 0"),
        # a backlog must last
        ("max by (job) (ruleloop_outbox_oldest_pending_seconds{job=\"ruleloop\"}) > 900",
         "max by (job) (ruleloop_outbox_oldest_pending_seconds{job=\"ruleloop\"}) > 9000"),
        # a replica that just started is no new rollback failure
        ("increase(ruleloop_remediation_rollbacks_failed_total{job=\"ruleloop\"}[1h])",
         "ruleloop_remediation_rollbacks_failed_total{job=\"ruleloop\"}"),
        # a job's failures, not its periods done
        ("result=\"failed\"}[15m]", "result=~\"failed|done\"}[15m]"),
        # one failed period of an hourly job is no alert
        ("result=\"failed\"}[15m])) > 0\n        for: 15m", "result=\"failed\"}[15m])) > 0\n        for: 5m"),
        # a lease's worth of lag (a period taken over) is no alert
        ("[15m]))\n          > 300", "[15m]))\n          > 60"),
    ],
)  # fmt: skip
def test_the_promtool_cases_catch_a_changed_rule(tmp_path: Path, old: str, new: str) -> None:
    text = RULES.read_text()
    assert old in text
    (tmp_path / RULES.name).write_text(text.replace(old, new))
    shutil.copy(TESTS, tmp_path)
    result = promtool_test(tmp_path)
    assert result.returncode == 1 and "FAILED" in result.stdout + result.stderr


def test_every_alert_has_cases_both_ways_labels_and_its_section() -> None:
    assert untested_alerts(RULES.read_text(), TESTS.read_text()) == []
    assert label_problems(RULES.read_text(), ALERTS_DOC.read_text()) == []
    # and the checks see these alerts: one without its cases or section is reported
    rules = RULES.read_text().replace("RuleloopOutboxBacklog", "RuleloopNew")
    assert "RuleloopNew: no promtool case where it fires (vllm-alerts.test.yml)" in untested_alerts(rules, TESTS.read_text())  # fmt: skip


def metrics_read(rules_text: str) -> set[str]:
    """The bot's metric names the rules' expressions read (histogram/counter suffixes kept)."""
    exprs = " ".join(rule["expr"] for group in yaml.safe_load(rules_text)["groups"] for rule in group["rules"])  # fmt: skip
    return set(re.findall(r"\bruleloop_[a-z_]+", exprs))


async def served_metrics(tmp_path: Path, slack: FakeSlack) -> set[str]:
    """The metric names the real bot's /metrics serves after an incident, over ASGI."""
    h = harness(tmp_path, slack=slack)
    try:
        slack.outage("5xx")  # a delivery retried: the labelled counters appear
        await h.webhook(body(alert()))
        await h.bot.tasks.drain()
        text = (await h.client.get("/metrics")).text
    finally:
        await h.close()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}  # fmt: skip


async def test_the_rules_read_only_metrics_the_bot_serves(tmp_path: Path, slack: FakeSlack) -> None:
    read = metrics_read(RULES.read_text())
    assert {"ruleloop_store_up", "ruleloop_outbox_messages", "ruleloop_outbox_oldest_pending_seconds",
            "ruleloop_remediation_rollbacks_failed_total"} <= read  # fmt: skip
    served = await served_metrics(tmp_path, slack)
    assert read - served == set()
    assert "ruleloop_webhook_total" not in served  # the comparison can find a missing name
    assert metrics_read("groups: [{name: g, rules: [{alert: A, expr: ruleloop_webhook_total > 0}]}]") - served == {"ruleloop_webhook_total"}  # fmt: skip


def test_the_prometheusrule_is_generated_from_the_rules_file() -> None:
    module = generator()
    assert PROMETHEUSRULE.read_text() == module.render(
        RULES.read_text(), name="ruleloop-alerts", source=RULES.name
    )
    assert module.main(["render_prometheusrule.py", "--check"]) == 0
    assert yaml.safe_load(PROMETHEUSRULE.read_text())["spec"] == yaml.safe_load(RULES.read_text())


def test_the_rules_ship_in_every_form(tmp_path: Path) -> None:
    operator = kustomize(KUBERNETES / "overlays" / "kube-prometheus-stack")
    (rule,) = [r for r in by_kind(operator, "PrometheusRule") if r["metadata"]["name"] == "ruleloop-alerts"]  # fmt: skip
    assert names(yaml.safe_dump(rule["spec"])) == SELF_ALERTS
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rule["spec"]))
    checked = subprocess.run([promtool(), "check", "rules", str(tmp_path / "rules.yml")],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    plain = kustomize(KUBERNETES / "overlays" / "example")
    (config_map,) = [c for c in by_kind(plain, "ConfigMap") if c["metadata"]["name"] == "vllm-alert-rules"]  # fmt: skip
    assert config_map["data"][RULES.name] == RULES.read_text()
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert RULES.name in config["rule_files"]
    assert "ruleloop" in [job["job_name"] for job in config["scrape_configs"]]
