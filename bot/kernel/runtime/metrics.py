"""The bot's own Prometheus metrics (served at /metrics), on a registry per app instance.

Besides this process's counters, each scrape shows a few numbers from the shared store
(``bot.kernel.store.readings.StoreReading``, handed in by the app): the outbox's backlog and the
remediations whose rollback failed. Every replica reports the same store, so alerts take
``max`` over them (deploy/prometheus/ruleloop-alerts.rules.yml); a store that does not answer
is ``ruleloop_store_up 0`` and no store numbers, never a failed scrape.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
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
# the states a remediation ends in (bot.kernel.store.ChangeState), each counted from 0
REMEDIATION_OUTCOMES = (
    "promoted", "rolled_back", "failed", "cancelled", "expired", "interrupted", "dry_run",
)  # fmt: skip
# a remediation's canary run: every gate met / a gate missed / none missed but some undecided /
# it could not run
CANARY_VERDICTS = ("met", "missed", "inconclusive", "error")
JOB_RESULTS = ("done", "failed", "lost")  # lost: another replica finished the period
JOB_LAG_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)


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
        self.background_shed = Counter(
            "ruleloop_background_shed",
            "Background work not started because its group was full (diagnosis, delivery): "
            "left owed for the outbox job.",
            ["group"],
            registry=r,
        )
        for group in ("diagnosis", "delivery"):  # exposed at 0 from the start (the alert reads it)
            self.background_shed.labels(group)
        self._changes_and_jobs(r)
        self._store = _StoreCollector()
        r.register(self._store)

    def shed(self, group: str) -> None:
        """One coroutine of ``group`` was not started (TaskSupervisor.try_spawn)."""
        self.background_shed.labels(group).inc()

    def observe_store(self, reading: StoreReading | None) -> None:
        """The store's numbers for the next expositions; None: the store did not answer."""
        self._store.reading = reading

    def exposition(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)

    def _changes_and_jobs(self, r: CollectorRegistry) -> None:
        """Remediations by outcome, their canaries' verdicts, and the scheduled jobs' periods
        (docs/operations.md, "Metrics"); every replica counts its own (sum them)."""
        self.remediations = Counter(
            "ruleloop_remediations",
            "Remediations that ended on this replica, by outcome (the state each ended in).",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.canary_verdicts = Counter(
            "ruleloop_canary_verdicts",
            "Remediation canary runs by verdict: met (every gate), missed (a gate missed), "
            "inconclusive (none missed, some undecided), error (the canary could not run).",
            ["verdict"], registry=r,
        )  # fmt: skip
        self.canary_gates = Counter(
            "ruleloop_canary_gate_verdicts",
            "Each gate of a remediation's canary run, by verdict (met, missed, inconclusive).",
            ["gate", "verdict"], registry=r,
        )  # fmt: skip
        self.job_runs = Counter(
            "ruleloop_scheduled_job_runs",
            "Scheduled job periods this replica ran, by result (done, failed, lost: another "
            "replica took the period over).",
            ["job_name", "result"], registry=r,
        )  # fmt: skip
        self.job_lag = Histogram(
            "ruleloop_scheduled_job_lag_seconds",
            "How late a period's run started after the period began (one taken over from a "
            "stopped replica: that much later).",
            ["job_name"], buckets=JOB_LAG_BUCKETS, registry=r,
        )  # fmt: skip
        for outcome in REMEDIATION_OUTCOMES:
            self.remediations.labels(outcome)
        for verdict in CANARY_VERDICTS:
            self.canary_verdicts.labels(verdict)

    def remediation_ended(self, outcome: str) -> None:
        """A remediation ended here in state ``outcome``."""
        self.remediations.labels(outcome).inc()

    def canary_judged(self, verdict: str, gates: Iterable[tuple[str, str]] = ()) -> None:
        """A remediation's canary run: the run's verdict and each gate's (name, verdict)."""
        self.canary_verdicts.labels(verdict).inc()
        for gate, decided in gates:
            self.canary_gates.labels(gate, decided).inc()

    def job_known(self, job: str) -> None:
        """A job this replica schedules: its series start at 0 (a first failure is a rise)."""
        for result in JOB_RESULTS:
            self.job_runs.labels(job, result)
        self.job_lag.labels(job)

    def job_started(self, job: str, *, lag_s: float) -> None:
        """A period of ``job`` started ``lag_s`` seconds after it began."""
        self.job_lag.labels(job).observe(max(lag_s, 0.0))

    def job_finished(self, job: str, result: str) -> None:
        """A period of ``job`` ended: done, failed or lost."""
        self.job_runs.labels(job, result).inc()
