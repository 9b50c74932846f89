"""deploy/grafana/ruleloop-dashboard.json against the bot's own /metrics.

Every PromQL expression of the dashboard must read only series the bot exposes (read from a real
``BotMetrics`` registry's text exposition, the store's numbers included), and group or match
only by labels those series carry (where the page shows a sample of them: a labelled counter
nothing has counted yet shows none), so a renamed metric or label fails here rather than
leaving an empty panel. Each check runs on the shipped file and on a broken copy.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bot.kernel.runtime import BotMetrics
from bot.kernel.store import StoreReading

DASHBOARD = Path(__file__).parent.parent / "deploy" / "grafana" / "ruleloop-dashboard.json"
NAME = re.compile(r"\b(ruleloop_[A-Za-z0-9_:]+)")
SELECTOR = re.compile(r"\b(ruleloop_[A-Za-z0-9_:]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exposed() -> dict[str, set[str] | None]:
    """Each series name the bot's /metrics page can show -> the labels its samples carry (None:
    no sample yet, its labels unknown), from a real registry whose store answered and whose
    scheduler knows a job (as a started bot's does)."""
    metrics = BotMetrics()
    metrics.observe_store(StoreReading(pending=1, failed=0, oldest_pending_s=3.0,
                                       rollbacks_failed=0))  # fmt: skip
    metrics.job_known("outbox")
    series: dict[str, set[str] | None] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        labels = {label for sample in family.samples for label in sample.labels}
        for suffix in SUFFIXES.get(family.type, ("",)):
            series[family.name + suffix] = (labels | {"le"}) if family.samples else None
    return series


def expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) of every target, rows' panels included."""
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield inner["title"], target["expr"]


def problems(dashboard: dict[str, Any], series: dict[str, set[str] | None]) -> list[str]:
    """What in the dashboard reads a series or a label the bot does not expose."""
    found = []
    for title, expr in expressions(dashboard):
        names = NAME.findall(expr)
        if not names:
            found.append(f"{title}: {expr!r} reads none of the bot's metrics")
        found += [f"{title}: {n} is not on the bot's /metrics" for n in names if n not in series]
        used = {label.strip() for group in GROUPING.findall(expr) for label in group.split(",")}
        used |= {label for _, inner in SELECTOR.findall(expr) for label in MATCHER.findall(inner)}
        for label in sorted(used - {""}):
            known = [series[n] for n in names if series.get(n) is not None]
            if known and not any(label in labels for labels in known if labels is not None):
                found.append(f"{title}: no series of {sorted(set(names))} has a label {label!r}")
    return found


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def test_every_expression_reads_what_the_bot_exposes(dashboard: dict[str, Any]) -> None:
    assert problems(dashboard, exposed()) == []
    read = {n for _, expr in expressions(dashboard) for n in NAME.findall(expr)}
    # the panels on-call asked for (issue 44): remediations, canaries, jobs, and the old ones
    for wanted in ("ruleloop_remediations_total", "ruleloop_canary_verdicts_total",
                   "ruleloop_canary_gate_verdicts_total", "ruleloop_scheduled_job_runs_total",
                   "ruleloop_scheduled_job_lag_seconds_bucket", "ruleloop_webhooks_total",
                   "ruleloop_diagnoses_total", "ruleloop_slack_deliveries_total",
                   "ruleloop_outbox_messages", "ruleloop_outbox_oldest_pending_seconds"):  # fmt: skip
        assert wanted in read, wanted


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("ruleloop_remediations_total", "ruleloop_remediation_total",
         "ruleloop_remediation_total is not on the bot's /metrics"),
        ("ruleloop_scheduled_job_lag_seconds_bucket", "ruleloop_scheduled_job_lag_bucket",
         "ruleloop_scheduled_job_lag_bucket is not on the bot's /metrics"),
        ("sum by (outcome) (increase(ruleloop_remediations_total",
         "sum by (result) (increase(ruleloop_remediations_total", "has a label 'result'"),
        ('ruleloop_scheduled_job_runs_total{result="failed"}',
         'ruleloop_scheduled_job_runs_total{state="failed"}', "has a label 'state'"),
    ],
    ids=["renamed-metric", "renamed-histogram", "wrong-grouping-label", "wrong-matcher-label"],
)  # fmt: skip
def test_a_broken_copy_is_refused(dashboard: dict[str, Any], old: str, new: str, why: str) -> None:
    broken = json.loads(json.dumps(dashboard).replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1]))
    assert broken != dashboard, f"{old!r} is not in the dashboard"
    assert any(why in p for p in problems(broken, exposed())), problems(broken, exposed())


def test_a_metric_renamed_in_the_bot_is_refused(dashboard: dict[str, Any]) -> None:
    series = exposed()
    renamed = copy.copy(series)
    renamed["ruleloop_canary_verdicts_v2_total"] = renamed.pop("ruleloop_canary_verdicts_total")
    assert problems(dashboard, series) == []
    assert any("ruleloop_canary_verdicts_total is not" in p for p in problems(dashboard, renamed))


def test_the_dashboard_is_importable(dashboard: dict[str, Any]) -> None:
    """What Grafana needs to import it: a uid, unique panel ids, a grid position each, and the
    Prometheus data source as a variable every panel and target uses."""
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    (source,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert source["query"] == "prometheus"
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}, panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs) and refs, panel["title"]
