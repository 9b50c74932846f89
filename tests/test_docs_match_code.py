"""Docs that describe the code, read beside it: the bot's routes and the Deployment's probes
(docs/bot.md), the scheduled jobs and their settings (docs/operations.md), what the
gateway's --help says about paths it does not know (bot/gateway/app.py answers 404), the RBAC
example's subject (docs/remediation-kubernetes.md) and who [access] lists may name."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from click.testing import CliRunner

from bot.app.cli import cli
from bot.gateway.app import PASSTHROUGH
from bot.kernel.config import SchedulerSettings
from bot.kernel.runtime.access import is_group

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"


def doc_routes(text: str) -> set[str]:
    """The paths in a doc's route table rows (`GET /x`, `POST /x`)."""
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    return {m for row in rows for m in re.findall(r"`(?:GET|POST)[^`]*? (/[\w/<>-]*)`", row.split(" | ")[0])}  # fmt: skip


def probe_paths() -> set[str]:
    deployment = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "base" / "deployment.yaml").read_text())  # fmt: skip
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {container[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")}


def test_bot_md_lists_every_route_and_the_probes_the_deployment_uses() -> None:
    code = set(re.findall(r'Route\("(/[^"]*)"', (ROOT / "bot" / "app" / "routes" / "endpoints.py").read_text()))  # fmt: skip
    documented = doc_routes((DOCS / "bot.md").read_text())
    assert code - documented == set(), "routes of bot/app/routes/endpoints.py missing in docs/bot.md"
    assert {"/livez", "/readyz"} <= probe_paths() <= code & documented


def test_operations_md_lists_every_scheduled_job_and_its_interval() -> None:
    text = (DOCS / "operations.md").read_text()
    table = text.split("## Scheduled jobs", 1)[1].split("```", 1)[0]
    names = set(re.findall(r'Job\(f?"([a-z_]+)', (ROOT / "bot" / "app" / "scheduler" / "jobs.py").read_text()))  # fmt: skip
    assert {"snapshot", "baseline", "workload", "outbox"} <= names
    missing = [n for n in sorted(names) if not re.search(rf"`{n}(:<target>)?`", table)]
    assert missing == [], f"scheduled jobs missing from docs/operations.md: {missing}"
    settings = [f for f in SchedulerSettings.model_fields if f != "targets"]
    assert [f for f in settings if not re.search(rf"^{f} = ", text, re.M)] == []


def test_gateway_help_says_unknown_paths_are_404() -> None:
    result = CliRunner().invoke(cli, ["gateway", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "every other path" not in text
    assert "answers 404 to any other path" in text
    assert [p for p in PASSTHROUGH if p not in text] == []
    assert "**404**, never forwarded" in (DOCS / "gateway.md").read_text()


def test_the_rbac_example_binds_the_service_account_the_bot_runs_as() -> None:
    text = (DOCS / "remediation-kubernetes.md").read_text()
    block = text.split("## RBAC", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    binding = next(d for d in yaml.safe_load_all(block) if d["kind"] == "RoleBinding")
    overlay = yaml.safe_load((ROOT / "deploy/kubernetes/overlays/example/kustomization.yaml").read_text())  # fmt: skip
    account = yaml.safe_load((ROOT / "deploy/kubernetes/base/serviceaccount.yaml").read_text())
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"],
         "namespace": overlay["namespace"]}
    ]  # fmt: skip


def test_access_docs_say_user_groups_count_as_the_code_reads_them() -> None:
    assert is_group("S0ONCALL1") and not is_group("U012ONCALL")
    reference = (DOCS / "configuration.md").read_text().split("## `[access]`", 1)[1]
    assert "user group IDs (S...: their members)" in reference.split("| key |", 1)[0]
    assert "user groups (S...: their members)" in (DOCS / "remediation.md").read_text()
