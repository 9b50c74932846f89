"""The diagnosis chart's axes (issue 22, item 15): distinct time ticks however short the
history, every axis label inside the figure, and the alert's mark saying what it marks.

Drawn with the chart module itself and measured with matplotlib's renderer.
"""

from __future__ import annotations

import datetime as dt

import pytest
from matplotlib.figure import Figure

from bot.diagnosis.chart import draw_chart, render_chart
from bot.diagnosis.chart_data import ChartData

END = dt.datetime(2026, 11, 29, 7, 39, tzinfo=dt.UTC).timestamp()


def chart(span_s: float, *, value_ms: float = 2400.0, history: bool = True) -> ChartData:
    """A TTFT incident: ``span_s`` of history a scrape every 15 s, the alert 100 s before the
    end, and a 10 s sampling window; values in the thousands of ms (wide tick labels)."""
    points: list[tuple[float, float | None]] = [
        (END - span_s + 15 * i, value_ms + 300 * (i % 5)) for i in range(int(span_s // 15) + 1)
    ]
    return ChartData(
        target="prod-a", metric="ttft_p99_ms", window=[(END - 10 + i, value_ms) for i in range(10)],
        waiting=[(END - 10 + i, 3.0) for i in range(10)], window_start=END - 10, window_end=END,
        history=points if history else [], history_query="ttft_p99_s", alert_start=END - 100,
        history_waiting=[(t, 2.0) for t, _ in points] if history else [],
    )  # fmt: skip


def drawn(data: ChartData) -> Figure:
    figure = draw_chart(data)
    figure.canvas.draw()
    return figure


@pytest.mark.parametrize("span_s", [150, 180, 420, 1800, 3 * 3600])
def test_the_history_axis_ticks_are_distinct(span_s: float) -> None:
    """Before: `%H:%M` on ticks 30 s apart read 07:37 07:37 07:38 07:38."""
    labels = [t.get_text() for t in drawn(chart(span_s)).axes[0].get_xticklabels()]
    shown = [text for text in labels if text]
    assert len(shown) >= 3 and len(set(shown)) == len(shown), shown


@pytest.mark.parametrize("history", [True, False])
def test_every_axis_label_is_inside_the_figure(history: bool) -> None:
    """Before: the history panel's y label ("TTFT p99 (ms)") was cut off at the left edge."""
    figure = drawn(chart(1800, value_ms=24000.0, history=history))
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    bounds = figure.bbox
    labels = [a.yaxis.label for a in figure.axes if a.yaxis.label.get_text()]
    assert len(labels) >= 2
    for label in labels:
        box = label.get_window_extent(renderer)
        assert box.x0 >= bounds.x0 and box.x1 <= bounds.x1, (label.get_text(), box, bounds)
        assert box.y0 >= bounds.y0 and box.y1 <= bounds.y1, (label.get_text(), box, bounds)
    for ax in figure.axes:
        for tick in ax.get_yticklabels():
            if tick.get_text():
                box = tick.get_window_extent(renderer)
                assert box.x0 >= bounds.x0 and box.x1 <= bounds.x1, tick.get_text()


def test_the_alert_mark_says_firing() -> None:
    """Alertmanager's startsAt is the firing time: the mark says so (pending was before)."""
    legend = drawn(chart(1800)).axes[0].get_legend()
    assert legend is not None
    texts = [t.get_text() for t in legend.get_texts()]
    assert "alert firing from 07:37 UTC (pending before)" in texts
    assert render_chart(chart(1800)).startswith(b"\x89PNG")
