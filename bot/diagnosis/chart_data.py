"""What the diagnosis chart shows, as plain data: the incident's metric over the sampling window
and, when the runbook's ``prometheus`` probe read it, over its history, with the alert's start.

The chart plots the metric the incident is about: the first chartable metric of the matched
ADR's conditions, else the one the alert is named for, else the one of the worst finding, else
TTFT. Its history is the ``prometheus`` probe's query named after the metric (``tpot_p99_ms``,
or ``tpot_p99_s`` in seconds; ``waiting`` or ``requests_waiting`` for the queue). The data is
kept in the diagnosis summary, so the incident page draws the same chart later.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bot.adr import MatchResult
from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.sampling import TPOT, SampledWindow
from bot.diagnosis.probes.types import Finding
from bot.diagnosis.probes.vllm_metrics import (
    E2E,
    ITL,
    QUEUE_TIME,
    RUNNING,
    TTFT,
    WAITING,
    Quantiles,
    gauge,
    kv_usage,
)

Point = tuple[float, float | None]  # (unix seconds, value; None: nothing observed then)


def _histogram_p99(names: Sequence[str]) -> Callable[[Exposition, Exposition], float | None]:
    return lambda before, after: Quantiles.from_histogram(before, after, names).p99


def _gauge(names: Sequence[str]) -> Callable[[Exposition, Exposition], float | None]:
    return lambda _before, after: gauge(after, names)


def _tpot_p99(before: Exposition, after: Exposition) -> float | None:
    """vLLM's own TPOT histogram, ITL on engines without it (as the window's TPOT)."""
    tpot = Quantiles.from_histogram(before, after, TPOT)
    return tpot.p99 if tpot.count else Quantiles.from_histogram(before, after, ITL).p99


@dataclass(frozen=True)
class ChartMetric:
    """A metric the chart can plot: its label, unit, and how one interval of the window reads it."""

    label: str
    unit: str  # "ms", "ratio" or "" (a count)
    worse_up: bool
    per_interval: Callable[[Exposition, Exposition], float | None]


CHARTABLE: dict[str, ChartMetric] = {
    "ttft_p99_ms": ChartMetric("TTFT p99", "ms", True, _histogram_p99(TTFT)),
    "tpot_p99_ms": ChartMetric("TPOT p99", "ms", True, _tpot_p99),
    "itl_p99_ms": ChartMetric("ITL p99", "ms", True, _histogram_p99(ITL)),
    "engine_itl_p99_ms": ChartMetric("ITL p99", "ms", True, _histogram_p99(ITL)),
    "engine_ttft_p99_ms": ChartMetric("TTFT p99", "ms", True, _histogram_p99(TTFT)),
    "e2e_p99_ms": ChartMetric("E2E latency p99", "ms", True, _histogram_p99(E2E)),
    "queue_time_p99_ms": ChartMetric("queue time p99", "ms", True, _histogram_p99(QUEUE_TIME)),
    # the fullest engine's share (a sum over engines or replicas would pass 1)
    "kv_cache_usage": ChartMetric("KV cache usage", "ratio", True, lambda _b, a: kv_usage(a)),
    "requests_waiting": ChartMetric("requests waiting", "", True, _gauge(WAITING)),
    "requests_running": ChartMetric("requests running", "", True, _gauge(RUNNING)),
}
DEFAULT_METRIC = "ttft_p99_ms"
# The shipped alerts (deploy/prometheus/vllm-alerts.rules.yml) and the metric each is about.
ALERT_METRICS = {
    "VLLMTimeToFirstTokenP99High": "ttft_p99_ms",
    "VLLMQueueTimeP99High": "queue_time_p99_ms",
    "VLLMKVCacheUsageHigh": "kv_cache_usage",
    "VLLMPreemptions": "kv_cache_usage",
}
# A runbook reading -> the chart metric (findings name readings: "vllm_metrics.tpot_p99_ms").
READING_METRICS = {
    "vllm_metrics.ttft_p99_ms": "ttft_p99_ms",
    "vllm_metrics.tpot_p99_ms": "tpot_p99_ms",
    "vllm_metrics.itl_p99_ms": "itl_p99_ms",
    "vllm_metrics.e2e_p99_ms": "e2e_p99_ms",
    "vllm_metrics.kv_cache_usage": "kv_cache_usage",
    "vllm_metrics.requests_waiting": "requests_waiting",
    "queue_cancel.queue_time_p99_ms": "queue_time_p99_ms",
}
QUEUE_QUERIES = ("waiting", "requests_waiting")
_READING = re.compile(r"\b([a-z_]+\.[a-z0-9_]+)\b")


def incident_metric(
    *, matches: Sequence[MatchResult], labels: Mapping[str, str], findings: Sequence[Finding]
) -> str:
    """The metric the incident is about: the matched ADR's, the alert's, the worst finding's."""
    for result in matches:
        for condition in result.conditions:
            if condition.metric in CHARTABLE:
                return condition.metric
    by_alert = ALERT_METRICS.get(labels.get("alertname", ""))
    if by_alert is not None:
        return by_alert
    for finding in findings:  # worst first
        for reading in _READING.findall(finding.source):
            if reading in READING_METRICS:
                return READING_METRICS[reading]
    return DEFAULT_METRIC


def history_queries(metric: str) -> list[tuple[str, float]]:
    """The prometheus probe's query names that give ``metric``, with the factor to its unit."""
    names = [(metric, 1.0)]
    if metric.endswith("_ms"):
        names.append((metric[: -len("_ms")] + "_s", 1000.0))
    if metric.startswith("engine_"):
        names += history_queries(metric[len("engine_") :])
    if metric == "requests_waiting":
        names.append(("waiting", 1.0))
    return names


@dataclass(frozen=True)
class ChartData:
    """Everything one chart shows; JSON-ready (``to_json``/``from_json``) for the store."""

    target: str
    metric: str
    window: list[Point]  # the metric per scrape interval of the sampling window
    waiting: list[Point]  # requests waiting at each scrape
    window_start: float
    window_end: float
    window_value: float | None = None  # the diagnosis's number for the whole window
    history: list[Point] = field(default_factory=list)  # Prometheus, in the metric's unit
    history_waiting: list[Point] = field(default_factory=list)
    history_query: str | None = None  # the runbook query the history came from
    history_missing: str | None = None  # why there is no history (when the probe ran)
    alert_start: float | None = None
    gate: float | None = None
    gate_adr: str | None = None
    normal: float | None = None

    @property
    def spec(self) -> ChartMetric:
        """How the metric is labelled and which way is worse."""
        return CHARTABLE[self.metric]

    @property
    def title(self) -> str:
        """E.g. 'prod-a: TPOT p99 and queue depth' (and the history's span, when there is one)."""
        title = f"{self.target}: {self.spec.label} and queue depth"
        if self.history:
            minutes = (self.window_end - self.history[0][0]) / 60
            title += f", last {minutes:.0f} min"
        return title

    @property
    def slug(self) -> str:
        """A file-name part naming the metric: 'ttft', 'tpot', 'kv'."""
        return self.metric.removeprefix("engine_").split("_")[0]

    def to_json(self) -> dict[str, Any]:
        """A dict for the store (NaN and infinity become None: JSON has neither)."""
        data = asdict(self)
        for key in ("window", "waiting", "history", "history_waiting"):
            data[key] = [[t, _finite(v)] for t, v in data[key]]
        for key in ("window_value", "gate", "normal"):
            data[key] = _finite(data[key])
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChartData:
        """The chart data a summary kept; ValueError when it is not one."""
        try:
            values = dict(data)
            for key in ("window", "waiting", "history", "history_waiting"):
                values[key] = [(float(t), None if v is None else float(v)) for t, v in values[key]]
            chart = cls(**values)
        except (TypeError, KeyError, ValueError) as exc:
            raise ValueError(f"not chart data: {exc}") from None
        if chart.metric not in CHARTABLE:
            raise ValueError(f"not chart data: unknown metric {chart.metric!r}")
        return chart


def build(
    *,
    target: str,
    metric: str,
    window: SampledWindow,
    window_end: float,
    window_value: float | None,
    details: Mapping[str, Any],
    alert_start: float | None,
    gate: tuple[float, str] | None,
    normal: float | None,
) -> ChartData:
    """The chart data of one diagnosis; ``window_end`` on the wall clock Prometheus uses."""
    spec = CHARTABLE[metric]
    pages = window.pages
    start = window_end - (pages[-1].at - pages[0].at)
    points = [
        (start + (page.at - pages[0].at), _finite(spec.per_interval(prev, page)))
        for prev, page in zip(pages, pages[1:], strict=False)
    ]
    waiting = [(start + (p.at - pages[0].at), gauge(p, WAITING)) for p in pages]
    history, query, missing = _history(metric, details)
    queue = _series(details, QUEUE_QUERIES)
    return ChartData(
        target=target,
        metric=metric,
        window=points,
        waiting=waiting,
        window_start=start,
        window_end=window_end,
        window_value=_finite(window_value),
        history=history,
        history_waiting=queue[0] if queue else [],
        history_query=query,
        history_missing=missing,
        alert_start=alert_start,
        gate=None if gate is None else gate[0],
        gate_adr=None if gate is None else gate[1],
        normal=_finite(normal),
    )


def _history(metric: str, details: Mapping[str, Any]) -> tuple[list[Point], str | None, str | None]:
    """The metric's history from the prometheus probe; else why there is none (None: no probe)."""
    series = (details.get("prometheus") or {}).get("series")
    if not isinstance(series, Mapping):
        return [], None, None
    for name, factor in history_queries(metric):
        points = series.get(name)
        if points:
            return [(float(t), _finite(float(v) * factor)) for t, v in points], name, None
        if name in series:
            return [], None, f"Prometheus returned no points for the runbook's `{name}` query"
    names = " or ".join(f"`{n}`" for n, _ in history_queries(metric))
    return (
        [],
        None,
        (
            f"the runbook's prometheus probe has no {names} query, so the chart has no "
            f"{CHARTABLE[metric].label} history"
        ),
    )


def _series(details: Mapping[str, Any], names: Sequence[str]) -> tuple[list[Point], str] | None:
    series = (details.get("prometheus") or {}).get("series") or {}
    for name in names:
        if series.get(name):
            return [(float(t), _finite(float(v))) for t, v in series[name]], name
    return None


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None
