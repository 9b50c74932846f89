"""Alertmanager webhook v4 payloads, shaped as Alertmanager 0.25 sends them."""

from __future__ import annotations

import json
from typing import Any

STARTS = "2026-09-01T02:13:07.861Z"


def alert(
    *,
    status: str = "firing",
    name: str = "VLLMTimeToFirstTokenP99High",
    instance: str = "10.0.0.5:8000",
    fingerprint: str = "4f1e0c55a3b2d9e1",
    starts_at: str = STARTS,
    **labels: str,
) -> dict[str, Any]:
    """One alert of a notification."""
    return {
        "status": status,
        "labels": {"alertname": name, "instance": instance, "job": "vllm", "severity": "page",
                   **labels},
        "annotations": {"summary": "TTFT p99 is 2.4 s (limit 1 s)"},
        "startsAt": starts_at,
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-09-01T02:40:07.861Z",
        "generatorURL": "http://prometheus:9090/graph?g0.expr=...",
        "fingerprint": fingerprint,
    }  # fmt: skip


def payload(
    *alerts: dict[str, Any],
    status: str | None = None,
    group_key: str = '{}:{alertname="VLLMTimeToFirstTokenP99High"}',
    **extra: Any,
) -> dict[str, Any]:
    """A notification of one group; its status is resolved only when every alert is."""
    alerts = alerts or (alert(),)
    if status is None:
        status = "resolved" if all(a["status"] == "resolved" for a in alerts) else "firing"
    return {
        "receiver": "ruleloop",
        "status": status,
        "alerts": list(alerts),
        "groupLabels": {"alertname": alerts[0]["labels"]["alertname"]},
        "commonLabels": dict(alerts[0]["labels"]),
        "commonAnnotations": dict(alerts[0]["annotations"]),
        "externalURL": "http://alertmanager:9093",
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
        **extra,
    }


def body(*alerts: dict[str, Any], **kwargs: Any) -> bytes:
    """The payload as the request body Alertmanager posts."""
    return json.dumps(payload(*alerts, **kwargs)).encode()
