"""The demo's second act: after the fix is kept, production starts sending other traffic.

The rule first records the traffic it was kept under: the incident's load on the fixed
engine, its shape captured from the engine's own /metrics while the "after" numbers are read.
Then a new agent workflow starts beside the chats, every request opening with the same long
system prompt. The scheduler's workload-drift job (``bot.app.scheduler.workload_drift``) captures
the live shape, finds it drifted from the rule's, re-runs the rule's gates with the canary replaying
the live shape, and posts the thread; the last screen shows both shapes and the verdict.

The drift is there by construction, on a machine of any speed: the incident's long prompts are
random tokens (the prefix cache finds nothing in them), while every agent request shares a
``SYSTEM_PROMPT``-token prefix, which the engine's prefix cache serves from the second request
on. The hit rate moves by far more than the 20 points the diff allows however fast requests
finish, and the capture window is sized from the slowest agent request measured here.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bot.adr import SharedAdrStore, load
from bot.adr.render import render
from bot.adr.workload import WorkloadShape, context_line
from bot.app.scheduler.workload_drift import LiveShape, WorkloadDrift
from bot.app.server import Bot
from bot.canary import Workload
from bot.kernel import Target
from bot.remediation import GateRun, run_gate

AGENT_STREAMS = 4
SYSTEM_PROMPT = 1536  # tokens every agent request opens with (its instructions and tools)
AGENT_PROMPT = 1792  # the system prompt and the agent's own turn
AGENT_OUTPUT = 16
WINDOW_PACES = 4  # the capture window: this many of the slowest agent request, at least


def agent_load(base_url: str, *, duration_s: float) -> Workload:
    """The new workflow: agents behind one long system prompt."""
    return Workload(
        endpoint=f"{base_url}/v1/completions", concurrency=AGENT_STREAMS, num_requests=None,
        duration_s=duration_s, prompt_length=AGENT_PROMPT, prefix_length=SYSTEM_PROMPT,
        output_length=AGENT_OUTPUT, seed=3,
    )  # fmt: skip


def record_workload(adr_path: Path, shape: WorkloadShape) -> str:
    """Write ``shape`` into the ADR's front matter as the workload it was proven on; the line
    its Context section now ends with."""
    adr = load(adr_path)
    adr_path.write_text(render(adr.model_copy(update={"workload": shape})))
    return context_line(shape)


@dataclass(frozen=True)
class DriftShown:
    """What the second act showed, for the last screen."""

    rule: str  # the traffic the rule was kept under, in words
    live: str  # what production sends now, in words
    moved: list[str]  # the dimensions that drifted
    verdict: list[str]  # the rule's gates under the live traffic
    posted: bool  # the drift thread was posted


async def run_second_act(
    bot: Bot,
    *,
    name: str,
    target: Target,
    adr_dir: Path,
    adr_id: str,
    pace_s: float,
    stop_load: Callable[[], Awaitable[None]],
) -> DriftShown:
    """One period of the drift job while the agents run; what it found.

    ``pace_s``: the slowest agent request measured here (sizes the capture window).
    ``stop_load``: stops the demo's traffic before the canary replays it, so the canary
    measures the rule's gates on the target alone, as the gate after a change does.
    """
    window = max(8.0, float(math.ceil(WINDOW_PACES * pace_s)))
    adrs = SharedAdrStore(root=adr_dir, db=bot.db)

    async def gate(*args: Any, **kwargs: Any) -> GateRun:
        await stop_load()
        return await run_gate(*args, **kwargs)

    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as http:
        job = WorkloadDrift(
            name=name, target=target, listed=[], db=bot.db, adrs=adrs, gate=gate,
            flows=bot.flows, read_shape=LiveShape(http=http, window_s=window),
        )  # fmt: skip
        outcome = await job(dt.datetime.now(dt.UTC))
    await bot.tasks.drain(timeout_s=600)
    detail = outcome.detail
    entry = adrs.find(adr_id)
    rule = entry[1].workload if entry is not None else None
    if "skipped" in detail:
        verdict = [f"not compared: {detail['skipped']}"]
    else:
        verdict = list(detail.get("revalidated") or ["alike: nothing to re-validate"])
    return DriftShown(
        rule="unknown" if rule is None else context_line(rule),
        live=str(detail.get("live", "not captured")),
        moved=list((detail.get("dimensions") or {}).get(adr_id, [])),
        verdict=verdict,
        posted=bool(detail.get("opened")),
    )
