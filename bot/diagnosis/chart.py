"""The diagnosis chart: TTFT p99 per interval and queue depth over the sampling window (PNG).

Uses matplotlib's object API on the Agg backend (no pyplot state), so charts can be drawn in
worker threads while the event loop serves Slack.
"""

from __future__ import annotations

import io

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bot.runbooks.sampling import SampledWindow


def render_chart(window: SampledWindow, *, title: str, ttft_limit_ms: float | None) -> bytes:
    """A PNG: TTFT p99 (left axis, ms) and requests waiting (right axis) against time."""
    points = window.points
    t = [p.t for p in points]
    ttft = [float("nan") if p.ttft_p99_ms is None else p.ttft_p99_ms for p in points]
    waiting = [0.0 if p.requests_waiting is None else p.requests_waiting for p in points]
    figure = Figure(figsize=(8, 3.6), dpi=100)
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    ax.plot(t, ttft, marker="o", color="tab:red", label="TTFT p99 (ms)")
    if ttft_limit_ms is not None:
        ax.axhline(ttft_limit_ms, color="tab:red", linestyle="--", linewidth=1, label="ADR gate")
    ax.set_xlabel("seconds into the sampling window")
    ax.set_ylabel("TTFT p99 per interval (ms)")
    queue = ax.twinx()
    queue.step(t, waiting, where="post", color="tab:blue", label="requests waiting")
    queue.set_ylabel("requests waiting")
    queue.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()[0] + queue.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper left", fontsize="small")
    ax.set_title(title, fontsize="medium")
    figure.subplots_adjust(left=0.09, right=0.91, top=0.9, bottom=0.14)  # tight_layout: 2x the cost
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return out.getvalue()
