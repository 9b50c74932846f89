"""deploy/alertmanager/alertmanager.yml, as Alertmanager itself routes it (`amtool config routes
test`): every shipped alert still reaches the receiver that paged for it before, and the vLLM
alerts reach the bot too. The bot's own alerts (ruleloop-alerts.rules.yml) go to the pager only:
a bot that is down cannot be told so through its own webhook."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.faults

ROOT = Path(__file__).parent.parent
CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
RULE_FILES = sorted((ROOT / "deploy" / "prometheus").glob("*.rules.yml"))
PAGER = "default"  # the example's existing receiver: what paged before the bot was added


def amtool() -> str:
    path = shutil.which("amtool")
    if path is None:
        pytest.skip("amtool is not installed (`make test` installs prometheus-alertmanager)")
    return path


def shipped_alerts() -> list[tuple[str, dict[str, str]]]:
    """(alertname, its static labels) of every rule in every shipped rules file."""
    found = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    found.append((rule["alert"], dict(rule.get("labels", {}))))
    return found


def receivers(config: Path, labels: dict[str, str]) -> list[str]:
    """The receivers Alertmanager resolves for an alert with ``labels``, in order."""
    argv = [amtool(), "config", "routes", "test", f"--config.file={config}"]
    result = subprocess.run(
        argv + [f"{k}={v}" for k, v in labels.items()], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip().split(",")


def routing_problems(config: Path) -> list[str]:
    problems = []
    for name, labels in shipped_alerts():
        got = receivers(config, {"alertname": name, **labels, "instance": "10.0.0.5:8000"})
        want = ["ruleloop", PAGER] if name.startswith("VLLM") else [PAGER]
        if sorted(got) != sorted(want):
            problems.append(f"{name} reaches {got}, not {want}")
    return problems


def test_the_rules_files_ship_alerts_of_the_engines_and_of_the_bot() -> None:
    names = [name for name, _ in shipped_alerts()]
    assert "VLLMEngineDown" in names and any(n.startswith("Ruleloop") for n in names)
    assert all(n.startswith(("VLLM", "Ruleloop")) for n in names), names


def test_every_shipped_alert_still_reaches_the_pager_and_vllm_ones_the_bot() -> None:
    assert routing_problems(CONFIG) == []


def test_a_route_that_stops_at_the_bot_is_found(tmp_path: Path) -> None:
    """The example as shipped before: `continue: false` on the bot's route."""
    text = CONFIG.read_text()
    assert "continue: true" in text
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(text.replace("continue: true", "continue: false"))
    problems = routing_problems(broken)
    assert "VLLMEngineDown reaches ['ruleloop'], not ['ruleloop', 'default']" in problems


def test_continue_without_a_route_for_the_pager_is_found(tmp_path: Path) -> None:
    """`continue: true` alone: an alert that matched a child never falls back to the parent."""
    config = yaml.safe_load(CONFIG.read_text())
    config["route"]["routes"] = config["route"]["routes"][:1]
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(yaml.safe_dump(config))
    assert "VLLMEngineDown reaches ['ruleloop'], not ['ruleloop', 'default']" in routing_problems(
        broken
    )


def bot_grouping(config: Path) -> list[str]:
    """The labels Alertmanager groups the bot's notifications by: its route's own ``group_by``,
    else what it inherits from the root route."""
    tree = yaml.safe_load(config.read_text())["route"]
    (route,) = [r for r in tree.get("routes", []) if r.get("receiver") == "ruleloop"]
    return list(route.get("group_by", tree.get("group_by", [])))


def grouping_problems(config: Path) -> list[str]:
    grouping = bot_grouping(config)
    if grouping != ["instance"]:
        return [f"the bot's notifications are grouped by {grouping}, not per engine (instance)"]
    return []


def test_the_bots_route_groups_per_engine_whatever_the_tree_groups_by() -> None:
    tree = yaml.safe_load(CONFIG.read_text())["route"]
    assert tree["group_by"] != ["instance"], "the root stands for a team's own grouping"
    assert grouping_problems(CONFIG) == []


def test_a_bot_route_that_inherits_the_roots_grouping_is_found(tmp_path: Path) -> None:
    """The example as shipped before: group_by only on the root, where a team's own tree (by
    alertname, say) then decides how the bot's notifications are grouped."""
    config = yaml.safe_load(CONFIG.read_text())
    (route,) = [r for r in config["route"]["routes"] if r["receiver"] == "ruleloop"]
    del route["group_by"]
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(yaml.safe_dump(config))
    assert grouping_problems(broken) == [
        "the bot's notifications are grouped by ['alertname'], not per engine (instance)"
    ]
