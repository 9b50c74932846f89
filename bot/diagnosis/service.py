"""The diagnoser: picks the runbook for an alert, runs it on a target, and reads the result.

It turns the runbook's readings into the four numbers, the readings ADR matching reads
(``match_readings``: names from ``bot.adr.metrics.METRICS``) and the baseline the accepted ADRs
set; the chart is drawn separately, after the numbers are posted (it costs about half a second
of CPU).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from bot.adr import AdrStore, MatchResult, by_cause, by_workload, matching
from bot.diagnosis import causes, chart_data, history, replica_gpus, replica_text, replicas
from bot.diagnosis.chart import render_chart
from bot.diagnosis.models import GATE_OF, Baseline, Diagnosis
from bot.diagnosis.normal import ReadNormal
from bot.diagnosis.probes.context import ProbeContext, TargetRef
from bot.diagnosis.probes.types import Finding, Severity
from bot.diagnosis.runbooks.loader import LoadedRunbook, RunbookSet
from bot.diagnosis.runbooks.runner import RunbookResult, RunbookRunner
from bot.kernel import UsageError
from bot.kernel.numbers import Measured, catalogue

log = logging.getLogger("ruleloop.diagnosis")
# The rules in force on a target (bot/app/scheduler/rules_now.py reads them from the store).
ReadRules = Callable[[str], Awaitable[causes.RulesInForce]]
# A target's "normal" four numbers (the scheduler's snapshots), shown next to "now".

# ADR match metric name -> the runbook reading that gives it: the catalogue's, then the rest.
MATCH_READINGS = {
    **{m.key: m.reading for m in catalogue.METRICS},
    "e2e_p99_ms": "vllm_metrics.e2e_p99_ms",
    "engine_ttft_p99_ms": "vllm_metrics.ttft_p99_ms",
    "engine_itl_p99_ms": "vllm_metrics.itl_p99_ms",
    "kv_cache_usage": "vllm_metrics.kv_cache_usage",
    "requests_waiting": "vllm_metrics.requests_waiting",
    "requests_running": "vllm_metrics.requests_running",
    "preemptions_per_s": "vllm_metrics.preemptions_per_s",
    "prefix_cache_hit_rate": "vllm_metrics.prefix_cache_hit_rate",
    "queue_time_p99_ms": "queue_cancel.queue_time_p99_ms",
    "wasted_prefill_tokens": "queue_cancel.wasted_prefill_tokens",
    "cancelled_share": "queue_cancel.cancelled_share",
}


def match_readings(readings: Measured) -> Measured:
    """What ADR matching reads: a runbook's readings under the match metrics' names."""
    return readings.pick(MATCH_READINGS)


class Diagnoser:
    """Runs runbooks for incidents; every outside seam comes in through the constructor."""

    def __init__(
        self,
        *,
        runbooks: RunbookSet,
        runner: RunbookRunner,
        adrs: AdrStore,
        context: Callable[[], ProbeContext],
        clock: Callable[[], dt.datetime],
        monotonic: Callable[[], float] = time.monotonic,
        normal: ReadNormal | None = None,
        rules: ReadRules | None = None,
    ) -> None:
        self._normal = normal
        self._rules = rules
        self._runbooks = runbooks
        self._runner = runner
        self._adrs = adrs
        self._context = context
        self._clock = clock
        self._monotonic = monotonic

    async def diagnose(
        self,
        target: TargetRef,
        *,
        labels: Mapping[str, str],
        alert_start: dt.datetime | None = None,
    ) -> Diagnosis:
        """Run the runbook that fits ``labels`` on ``target`` and read the result (with
        ``alert_start``, the chart and the history's finding place the alert)."""
        loaded = self._select(labels)
        ctx = self._context()
        t0 = self._monotonic()
        result = await self._runner.run(loaded, target=target, ctx=ctx)
        ended = ctx.wall_clock()  # the clock Prometheus's history is on
        t1 = self._monotonic()
        accepted = await asyncio.to_thread(self._adrs.accepted)
        normal = await self._read_normal(target.name)
        rules = await self._read_rules(target.name)
        baseline = Baseline.from_adrs(accepted)
        headline = Measured({m.key: result.readings.reading(m.reading) for m in catalogue.HEADLINE})
        matches = matching(accepted, match_readings(result.readings), normal)
        window = result.windows.get("vllm_metrics")  # the four numbers' window, charted
        t2 = self._monotonic()
        sampling = max((w.pages[-1].at - w.pages[0].at for w in result.windows.values()), default=0)
        chart = _chart(
            target, labels, result, matches, baseline, normal, ended=ended, alert_start=alert_start
        )
        fleet, fleet_findings = _one_or_all(loaded, result, baseline, headline)
        judged = _causes(loaded, result, fleet, rules)
        judged = await replica_gpus.judged_for_slow(
            loaded, result, fleet, judged, target=target, ctx=ctx
        )
        matches, cause_notes = by_cause(matches, judged)  # an ADR's cause ruled out: not offered
        # a rule proven on other traffic: not offered (the line says which dimension moved)
        matches, workload_notes = by_workload(matches, result.workload, result.workload_unknown)
        # one slow replica: a fleet-wide flag change is not its fix (the thread says what is)
        offered, withheld = ([], matches) if fleet and fleet.slow else (matches, [])
        return Diagnosis(
            target=target.name,
            runbook=loaded.name,
            headline=headline,
            baseline=baseline,
            findings=_findings(fleet_findings, result, chart, cause_notes, workload_notes),
            matches=offered,
            withheld=withheld,
            replicas=fleet,
            readings=result.readings,
            details=result.details,
            sampling_s=sampling,
            at=self._clock(),
            window=window,
            timings={"runbook_s": t1 - t0, "adrs_s": t2 - t1},
            normal=normal,
            chart=chart,
            causes=judged,
            workload=result.workload,
        )

    def _select(self, labels: Mapping[str, str]) -> LoadedRunbook:
        """The runbook for the alert's labels; a usage error names them when none fits."""
        loaded = self._runbooks.select(labels)
        if loaded is None:
            raise UsageError(
                f"no runbook matches {dict(labels)}; add one with an empty `match` as a default"
            )
        return loaded

    async def _read_normal(self, target: str) -> Measured:
        """The target's "normal" numbers; none (not a failed diagnosis) when they cannot be read."""
        if self._normal is None:
            return Measured()
        try:
            return await self._normal(target)
        except Exception:
            log.warning("could not read the normal numbers of %s", target, exc_info=True)
            return Measured()

    async def _read_rules(self, target: str) -> causes.RulesInForce | None:
        """The rules in force on the target; None (their causes not judged) when unread."""
        if self._rules is None:
            return None
        try:
            return await self._rules(target)
        except Exception:
            log.warning("could not read the rules in force on %s", target, exc_info=True)
            return None

    async def chart(self, diagnosis: Diagnosis) -> bytes | None:
        """The PNG of the incident's metric and queue depth (drawn in a worker thread)."""
        if diagnosis.chart is None:
            return None
        return await asyncio.to_thread(render_chart, diagnosis.chart)


def _findings(
    fleet: list[Finding],
    result: RunbookResult,
    chart: chart_data.ChartData | None,
    cause_notes: list[str],
    workload_notes: list[str],
) -> list[Finding]:
    """The fleet's findings, the runbook's, the history's, then why an ADR was not offered
    (its cause ruled out, its workload not production's)."""
    return [
        *fleet,
        *result.findings,
        *(history.describe(chart) if chart else []),
        *(Finding(Severity.INFO, line, source="adr cause") for line in cause_notes),
        *(Finding(Severity.INFO, line, source="adr workload") for line in workload_notes),
    ]


def _causes(
    loaded: LoadedRunbook,
    result: RunbookResult,
    fleet: replicas.FleetVerdict | None,
    rules: causes.RulesInForce | None,
) -> list[causes.CauseVerdict]:
    """The runbook's hypotheses judged on the run's readings (and the fleet's one replica, and
    the causes judged against the rules in force)."""
    return causes.judge(loaded.runbook, result.readings, fleet, rules)


def _one_or_all(
    loaded: LoadedRunbook,
    result: RunbookResult,
    baseline: Baseline,
    headline: Measured,
) -> tuple[replicas.FleetVerdict | None, list[Finding]]:
    """The replica rule's verdict on a fleet and its findings (none for one engine). "Slow"
    for the fleet: a runbook rule warned, or a headline latency is past its gate."""
    verdict = replicas.of_run(result)
    if verdict is None:
        return None, []
    ruled = any(
        f.severity >= Severity.WARNING and f.source.startswith(f"{loaded.name}:")
        for f in result.findings
    )
    gated = any(
        baseline.verdict(k, headline.value(k)) is False for k in ("ttft_p99_ms", "tpot_p99_ms")
    )
    return verdict, replica_text.findings(verdict, fleet_slow=ruled or gated)


def _chart(
    target: TargetRef,
    labels: Mapping[str, str],
    result: RunbookResult,
    matches: list[MatchResult],
    baseline: Baseline,
    normal: Measured,
    *,
    ended: float,
    alert_start: dt.datetime | None,
) -> chart_data.ChartData | None:
    """The chart's data for the incident's metric over the four numbers' window; None when the
    run sampled no window to draw."""
    window = result.windows.get("vllm_metrics")
    if window is None or not window.points:
        return None
    metric = chart_data.incident_metric(matches=matches, labels=labels, findings=result.findings)
    return chart_data.build(
        target=target.name,
        metric=metric,
        window=window,
        window_end=ended,
        window_value=result.reading(MATCH_READINGS.get(metric, f"vllm_metrics.{metric}")),
        details=result.details,
        alert_start=None if alert_start is None else alert_start.timestamp(),
        gate=_gate(metric, matches, baseline),
        normal=normal.value(metric),
    )


def _gate(metric: str, matches: list[MatchResult], baseline: Baseline) -> tuple[float, str] | None:
    """The chart's gate line: the matched ADR's gate on the metric (a number: a relative one
    multiplies a canary run the chart does not show), else the strictest accepted one."""
    gate = GATE_OF.get(metric)
    if gate is None:
        return None
    for result in matches:
        gates = result.adr.gates
        if gates is None:
            continue
        value = getattr(gates.resolve({}, strict=False), gate)
        if isinstance(value, int | float):
            return float(value), result.adr.id
    limit = baseline.limits.get(metric)
    return None if limit is None else (limit.value, limit.adr_id)
