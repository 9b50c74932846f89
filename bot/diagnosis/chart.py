"""The diagnosis chart (PNG for Slack, SVG for the incident page), drawn from ``ChartData``.

With history (the runbook's ``prometheus`` probe), two panels: the metric and the queue over
the history, the alert's start and the sampling window marked, then the sampling window itself
in seconds. Without, the sampling window alone. The ADR gate and the target's normal are
dashed lines. Uses matplotlib's object API on the Agg backend (no pyplot state), so charts can
be drawn in worker threads while the event loop serves Slack.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Sequence
from typing import Literal

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, date2num
from matplotlib.figure import Figure

from bot.diagnosis.chart_data import ChartData, Point
from bot.diagnosis.history import clock, number

METRIC, QUEUE, GATE, NORMAL, ALERT, WINDOW = (
    "tab:red", "tab:blue", "tab:red", "tab:gray", "black", "gold",
)  # fmt: skip


def render_chart(chart: ChartData, *, fmt: Literal["png", "svg"] = "png") -> bytes:
    """The chart as PNG (Slack) or SVG (the incident page)."""
    out = io.BytesIO()
    draw_chart(chart).savefig(out, format=fmt, metadata=_metadata(fmt))
    return out.getvalue()


def draw_chart(chart: ChartData) -> Figure:
    """The chart's figure. Laid out by matplotlib's constrained layout, so axis labels, tick
    labels and the legends below the panels stay inside the figure whatever their widths."""
    if chart.history:
        figure = Figure(figsize=(10, 4.4), dpi=100, layout="constrained")
        FigureCanvasAgg(figure)
        grid = figure.add_gridspec(1, 2, width_ratios=(3, 1.2))
        _history_panel(figure.add_subplot(grid[0]), chart)
        _window_panel(figure.add_subplot(grid[1]), chart, compact=True)
    else:
        figure = Figure(figsize=(8, 4.2), dpi=100, layout="constrained")
        FigureCanvasAgg(figure)
        _window_panel(figure.add_subplot(), chart, compact=False)
    figure.get_layout_engine().set(w_pad=0.1, h_pad=0.08, wspace=0.06)  # type: ignore[union-attr, call-arg]
    figure.suptitle(chart.title, fontsize="medium")
    return figure


def _metadata(fmt: str) -> dict[str, str | None]:
    # no creation date in the SVG: the same chart is the same bytes (cacheable, diffable)
    return {"Date": None} if fmt == "svg" else {}


def _scale(chart: ChartData) -> float:
    """Ratios are shown in percent."""
    return 100.0 if chart.spec.unit == "ratio" else 1.0


def _axis_label(chart: ChartData) -> str:
    unit = {"ms": " (ms)", "ratio": " (%)"}.get(chart.spec.unit, "")
    return f"{chart.spec.label}{unit}"


def _values(points: Sequence[Point], scale: float) -> tuple[list[float], list[float]]:
    """The points that have a value (intervals without an observation are left out)."""
    kept = [(t, v * scale) for t, v in points if v is not None]
    return [t for t, _ in kept], [v for _, v in kept]


def _when(t: float) -> float:
    """Unix seconds on matplotlib's date axis (days)."""
    return float(date2num(dt.datetime.fromtimestamp(t, dt.UTC)))


def _lines(ax: Axes, chart: ChartData, scale: float, *, labelled: bool = True) -> None:
    """The ADR gate and the target's normal, as horizontal lines."""
    unit = chart.spec.unit
    if chart.gate is not None:
        bound = "≤" if chart.spec.worse_up else "≥"
        label = f"gate {bound} {number(unit, chart.gate)} ({chart.gate_adr})"
        ax.axhline(chart.gate * scale, color=GATE, linestyle="--", linewidth=1,
                   label=label if labelled else None)  # fmt: skip
    if chart.normal is not None:
        label = f"normal {number(unit, chart.normal)}"
        ax.axhline(chart.normal * scale, color=NORMAL, linestyle=":", linewidth=1.2,
                   label=label if labelled else None)  # fmt: skip


def _history_panel(ax: Axes, chart: ChartData) -> None:
    scale = _scale(chart)
    t, v = _values(chart.history, scale)
    ax.plot([_when(x) for x in t], v, color=METRIC, linewidth=1.6, label=chart.spec.label)
    _lines(ax, chart, scale)
    ax.axvspan(_when(chart.window_start), _when(chart.window_end), color=WINDOW, alpha=0.6,
               label="sampling window (right)")  # fmt: skip
    ax.annotate("sampling\nwindow", xy=(_when(chart.window_start), 0),
                xycoords=("data", "axes fraction"), xytext=(-6, 10), textcoords="offset points",
                ha="right", fontsize="x-small",
                arrowprops={"arrowstyle": "->", "color": "darkgoldenrod"})  # fmt: skip
    start = chart.history[0][0]
    # Alertmanager's startsAt is when the alert fired: it was pending for its rule's `for:`
    # before, and neither the webhook nor the history says since when, so the mark says firing
    if chart.alert_start is not None and start <= chart.alert_start <= chart.window_end:
        label = f"alert firing from {clock(chart.alert_start)} (pending before)"
        ax.axvline(_when(chart.alert_start), color=ALERT, linestyle="-.", linewidth=1, label=label)
    elif chart.alert_start is not None:
        ax.plot([], [], " ", label=f"alert firing from {clock(chart.alert_start)} (before this)")
    ax.set_ylabel(_axis_label(chart))
    ax.set_ylim(bottom=0)
    ax.set_xlim(_when(start), _when(chart.window_end))
    ax.xaxis_date(dt.UTC)
    locator = AutoDateLocator(tz=dt.UTC, minticks=3, maxticks=8)
    formatter = ConciseDateFormatter(locator, tz=dt.UTC, show_offset=False)
    # each tick says the time to the precision the ticks differ at: never 07:37 07:37
    formatter.formats = ["%Y", "%b", "%d", "%H:%M", "%H:%M", "%H:%M:%S"]
    formatter.zero_formats = ["", "%Y", "%b %d", "%b %d %H:%M", "%H:%M", "%H:%M:%S"]
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(formatter)
    ax.set_xlabel("time (UTC)")
    handles = ax.get_legend_handles_labels()[0]
    if chart.history_waiting:
        queue = ax.twinx()
        qt, qv = _values(chart.history_waiting, 1.0)
        queue.step([_when(x) for x in qt], qv, where="post", color=QUEUE, alpha=0.6,
                   linewidth=1, label="requests waiting")  # fmt: skip
        _queue_limits(queue, qv)
        queue.set_ylabel("requests waiting")
        handles += queue.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3,
              fontsize="x-small", frameon=False)  # fmt: skip


def _window_panel(ax: Axes, chart: ChartData, *, compact: bool) -> None:
    scale = _scale(chart)
    t, v = _values(chart.window, scale)
    ax.plot([x - chart.window_start for x in t], v, marker="o", color=METRIC,
            label=f"{chart.spec.label} per interval")  # fmt: skip
    if chart.window_value is not None:
        ax.axhline(chart.window_value * scale, color=METRIC, alpha=0.45, linewidth=3,
                   label=f"whole window {number(chart.spec.unit, chart.window_value)}")  # fmt: skip
    _lines(ax, chart, scale, labelled=not compact)  # the history panel's legend has them
    ax.set_xlim(0, max(chart.window_end - chart.window_start, 1.0))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("seconds into the sampling window")
    if compact:
        ax.set_title("sampling window", fontsize="small")
    else:
        ax.set_ylabel(f"{_axis_label(chart)} per interval")
    queue = ax.twinx()
    qt, qv = _values(chart.waiting, 1.0)
    queue.step([x - chart.window_start for x in qt], qv, where="post", color=QUEUE,
               label="requests waiting")  # fmt: skip
    _queue_limits(queue, qv)
    queue.set_ylabel("requests waiting")
    handles = ax.get_legend_handles_labels()[0] + queue.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18),
              ncol=1 if compact else 3, fontsize="x-small" if compact else "small",
              frameon=False)  # fmt: skip


def _queue_limits(queue: Axes, values: Sequence[float]) -> None:
    """From 0, and at least to 1 (an empty queue is a flat line, not a 0.05 scale)."""
    queue.set_ylim(0, max(1.0, max(values, default=0.0) * 1.1))
