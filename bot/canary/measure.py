"""Runs the canary for one configuration, with optional background load competing with it.

The measured canary scrapes the engine and computes the four metrics. Background classes (for
example long shared-system-prompt requests beside short chats) load the same engine from the
start until the measured canary is done, then are cancelled; their client-side numbers are
kept in the report under ``background``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from bot.canary.report import CanaryMeasurement
from bot.canary.runner import CanaryRun, Progress
from bot.canary.schema import BackgroundClass, CanaryReport
from bot.canary.shape_replay import fixed_shape
from bot.canary.verdict import Gates, Judged, judged
from bot.canary.workload import Workload

# Let background load reach its steady state before the measured window opens.
BACKGROUND_LEAD_S = 2.0


def measure(
    workload: Workload,
    *,
    gates: Gates,
    metrics_url: str | None,
    background: Sequence[tuple[str, Workload]] = (),
    sample_interval_s: float = 0.5,
    on_progress: Callable[[Progress], None] | None = None,
    progress_interval_s: float = 5.0,
) -> CanaryReport:
    """Run the canary (and its background load); return the canary report, judged."""
    run = asyncio.run(
        measure_async(
            workload,
            gates=gates,
            metrics_url=metrics_url,
            background=background,
            sample_interval_s=sample_interval_s,
            on_progress=on_progress,
            progress_interval_s=progress_interval_s,
        )
    )
    return run.report


async def measure_async(
    workload: Workload,
    *,
    gates: Gates,
    metrics_url: str | None,
    background: Sequence[tuple[str, Workload]],
    sample_interval_s: float,
    on_progress: Callable[[Progress], None] | None,
    progress_interval_s: float,
) -> Judged:
    """``measure`` inside a running event loop: the report, judged once."""
    runs = [(name, CanaryRun(w, metrics_url=None)) for name, w in background]
    started = time.perf_counter()
    tasks = [asyncio.create_task(run.run()) for _, run in runs]
    try:
        if tasks:
            await asyncio.sleep(BACKGROUND_LEAD_S)
            _raise_if_failed(tasks)
        canary = CanaryRun(
            workload,
            gates=gates,
            metrics_url=metrics_url,
            sample_interval_s=sample_interval_s,
            on_progress=on_progress,
            progress_interval_s=progress_interval_s,
        )
        report = await canary.run()
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    out = report.numbers()
    if runs:
        wall = time.perf_counter() - started
        classes = [_client_side(name, run, wall) for name, run in runs]
        out = out.model_copy(update={"background": classes})
    # With background load the gates read the canary's own goodput and internal fragmentation.
    return judged(out, gates)


def _raise_if_failed(tasks: Sequence[asyncio.Task[CanaryMeasurement]]) -> None:
    for task in tasks:
        if task.done() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def _client_side(name: str, run: CanaryRun, wall_s: float) -> BackgroundClass:
    """What a background class saw, from its finished requests (client side only)."""
    finished = [r for r in run.records if r.outcome is not None]
    shape = run.workload.shape or fixed_shape(
        run.workload, request_rate=max(len(finished), 1) / wall_s if wall_s > 0 else 1.0
    )
    report = CanaryMeasurement(
        shape=shape,
        workload={"name": name, **_plain(run.workload)},
        records=finished,
        engine=None,
        samples=[],
        gates=Gates(),
        wall_s=wall_s,
        client_cpu_s=0.0,
    )
    data = report.numbers()  # client side only: nothing to judge
    return BackgroundClass(
        workload=data.workload, ttft_ms=data.ttft_ms, tpot_ms=data.tpot_ms,
        requests=data.requests, tokens=data.tokens, errors=data.errors,
    )  # fmt: skip


def _plain(workload: Workload) -> dict[str, Any]:
    return {k: (v.value if hasattr(v, "value") else v) for k, v in asdict(workload).items()}
