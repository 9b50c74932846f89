"""What the metric's history says: when the rise began, from what to what, and the alert.

Read from the chart data's Prometheus history (``bot.diagnosis.chart_data``). The level before
the rise is the lower quartile of the points up to the peak (a few noisy points do not move it);
the rise begins at the first point above that level by a tenth of the rise, walking back from
the first point past half of it. A metric where lower is worse (none of the chartable ones yet)
is read mirrored.
"""

from __future__ import annotations

import datetime as dt
import statistics

from bot.diagnosis.chart_data import ChartData
from bot.diagnosis.probes.types import Finding, Severity

SOURCE = "prometheus history"
MIN_POINTS = 3
RISE_FACTOR = 1.25  # the peak must be this much above the level before it to be a rise


def number(unit: str, value: float) -> str:
    """A value in the chart's unit, as people read it: '41.3 ms', '2,436 ms', '93 %', '14'."""
    if unit == "ms":
        return f"{value:,.0f} ms" if value >= 100 else f"{value:.1f} ms"
    if unit == "ratio":
        return f"{value * 100:.0f} %"
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def clock(t: float) -> str:
    """Unix seconds as 'HH:MM UTC'."""
    return f"{dt.datetime.fromtimestamp(t, dt.UTC):%H:%M} UTC"


def describe(chart: ChartData) -> list[Finding]:
    """Findings on the history (none when the diagnosis read no Prometheus)."""
    if chart.history_missing:
        return [Finding(Severity.INFO, chart.history_missing, SOURCE)]
    points = [(t, v) for t, v in chart.history if v is not None]
    if not chart.history_query:
        return []
    label, unit = chart.spec.label, chart.spec.unit
    span = (chart.window_end - chart.history[0][0]) / 60 if chart.history else 0.0
    if len(points) < MIN_POINTS:
        message = f"Prometheus has {len(points)} point(s) of {label} history: too few to read"
        return [Finding(Severity.INFO, message, SOURCE)]
    rise = _rise(points, worse_up=chart.spec.worse_up)
    if rise is None:
        low = min(v for _, v in points)
        high = max(v for _, v in points)
        message = (
            f"{label} stayed between {number(unit, low)} and {number(unit, high)} over the "
            f"last {span:.0f} min: no rise inside the history"
        )
        return [Finding(Severity.INFO, message, SOURCE)]
    before, peak, began, peaked = rise
    verb = "rose" if chart.spec.worse_up else "fell"
    message = (
        f"{label} {verb} from {number(unit, before)} to {number(unit, peak)} starting "
        f"{clock(began)}" + _against_alert(began, chart.alert_start)
        + f" (peak at {clock(peaked)}; Prometheus, last {span:.0f} min)"
    )  # fmt: skip
    return [Finding(Severity.INFO, message, SOURCE)]


Rise = tuple[float, float, float, float]  # level before, peak, when it began, when it peaked


def _rise(points: list[tuple[float, float]], *, worse_up: bool) -> Rise | None:
    """(level before, peak, when the rise began, when it peaked), or None without a rise."""
    sign = 1.0 if worse_up else -1.0
    values = [sign * v for _, v in points]
    top = max(range(len(values)), key=lambda i: values[i])
    if top == 0:
        return None  # highest at the start: whatever began, began before the history
    level = _lower_quartile(values[: top + 1])
    peak = values[top]
    if peak - level <= abs(level) * (RISE_FACTOR - 1) or peak == level:
        return None
    half = level + (peak - level) / 2
    first_high = next(i for i, v in enumerate(values) if v >= half)
    began = first_high
    while began > 0 and values[began - 1] > level + (peak - level) / 10:
        began -= 1
    return sign * level, sign * peak, points[began][0], points[top][0]


def _lower_quartile(values: list[float]) -> float:
    if len(values) < 4:
        return min(values)
    return statistics.quantiles(values, n=4)[0]


def _against_alert(began: float, alert_start: float | None) -> str:
    """', 8 min before the alert' (or after it, or as it fired)."""
    if alert_start is None:
        return ""
    minutes = round((alert_start - began) / 60)
    if minutes >= 1:
        return f", {minutes} min before the alert"
    if minutes <= -1:
        return f", {-minutes} min after the alert fired"
    return ", as the alert fired"
