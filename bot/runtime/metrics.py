"""The bot's own Prometheus metrics (served at /metrics), on a registry per app instance."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class BotMetrics:
    """Webhooks, diagnoses and Slack deliveries by outcome, and webhook-to-posted latency."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.webhooks = Counter(
            "ruleloop_webhooks", "Alertmanager webhooks by outcome.", ["outcome"], registry=r
        )
        self.diagnoses = Counter(
            "ruleloop_diagnoses", "Diagnoses by outcome (posted, failed).", ["outcome"], registry=r
        )
        self.latency = Histogram(
            "ruleloop_diagnosis_post_seconds",
            "Webhook received -> diagnosis posted, excluding the sampling window.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.deliveries = Counter(
            "ruleloop_slack_deliveries",
            "Slack messages owed to incidents, by kind and outcome (sent, retried, failed).",
            ["kind", "outcome"],
            registry=r,
        )
        self.slack_requests = Counter(
            "ruleloop_slack_requests",
            "Requests to /slack/events by verdict.",
            ["verdict"],
            registry=r,
        )

    def exposition(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
