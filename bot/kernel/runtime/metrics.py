"""The bot's own Prometheus metrics (served at /metrics), on a registry per app instance.

Besides this process's counters, each scrape shows a few numbers from the shared store
(``bot.kernel.store.readings.StoreReading``, handed in by the app): the outbox's backlog and the
remediations whose rollback failed. Every replica reports the same store, so alerts take
``max`` over them (deploy/prometheus/ruleloop-alerts.rules.yml); a store that does not answer
is ``ruleloop_store_up 0`` and no store numbers, never a failed scrape.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from bot.kernel.store.readings import StoreReading


class _StoreCollector(Collector):
    def __init__(self) -> None:
        self.reading: StoreReading | None = None

    def collect(self) -> Iterator[Metric]:
        reading = self.reading
        yield GaugeMetricFamily(
            "ruleloop_store_up",
            "1 when the incident store answered this scrape, else 0.",
            value=0 if reading is None else 1,
        )
        if reading is None:
            return
        messages = GaugeMetricFamily(
            "ruleloop_outbox_messages",
            "Slack messages in the shared outbox by state (pending: owed; failed: refused).",
            labels=["state"],
        )
        messages.add_metric(["pending"], reading.pending)
        messages.add_metric(["failed"], reading.failed)
        yield messages
        yield GaugeMetricFamily(
            "ruleloop_outbox_oldest_pending_seconds",
            "Age of the oldest Slack message still owed (0 with none).",
            value=reading.oldest_pending_s,
        )
        yield CounterMetricFamily(
            "ruleloop_remediation_rollbacks_failed",
            "Remediations whose rollback failed (from the audit log: every replica's, ever).",
            value=reading.rollbacks_failed,
        )


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
        self._store = _StoreCollector()
        r.register(self._store)

    def observe_store(self, reading: StoreReading | None) -> None:
        """The store's numbers for the next expositions; None: the store did not answer."""
        self._store.reading = reading

    def exposition(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
