"""The demo's second act: after the fix is kept, production starts sending other traffic.

The rule first records the traffic it was kept under: the incident's load on the fixed
engine, its shape captured from the engine's own /metrics while the "after" numbers are read.
Then a new agent workflow starts beside the chats, every request opening with the same long
system prompt. The scheduler's workload-drift job (``bot.app.scheduler.workload_drift``) captures
the live shape, finds it drifted from the rule's, and re-validates the rule like for like, as a
team that allows it would (``drift_before_run``): the flags the rule replaced
(``--max-num-batched-tokens 8192``) serve again for one canary run replaying the live shape, the
fix's flags are put back, and the rule's '0.5x before' gate judges the fix against that before,
on the same replay, with the statistical judge of /apply-adr. It posts the thread; the last
screen shows both shapes, the before and the verdict.

The fix no longer helps, by construction, on a machine of any speed (the article's story: the
same rule, a new workload): capping the scheduler step helped chats because whole 2,048-token
random prompts shared a step with their tokens. The agents' prompts are served from the prefix
cache but for their own turn (256 tokens), so no step is stalled by a whole prompt with or
without the cap: the fix's TPOT is about its before's, never half of it, and the U test of
"under 0.5x before" cannot pass. With 8 requests a side it says "missed" (above it at 99 %)
or, as often, "not decided" (the runs' spread is wide at that count), which fails the gate too:
a rule is held to have helped on evidence only.
Both runs replay the same shape after a warm-up that fills the prefix cache.

The thread then offers the next step, and the demo's approver presses it (``run_retune``): the
re-tune's one trial (the fix's step at a quarter: the most chunking, the likeliest to help)
restarts the engine, replays the same number of requests of the live shape, is judged by the
same U test against the same before-run, and the fix is restored. By the same mechanism no step
budget halves the agents' TPOT here, so the answer is "did not meet: no draft": a rule is
drafted on evidence only, and the demo shows whichever answer the engine gave.

The drift is there by construction, on a machine of any speed: the incident's long prompts are
random tokens (the prefix cache finds nothing in them), while every agent request shares a
``SYSTEM_PROMPT``-token prefix, which the engine's prefix cache serves from the second request
on. The hit rate moves by far more than the 20 points the diff allows however fast requests
finish, and the capture window is sized from the slowest agent request measured here.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from bot.adr import SharedAdrStore, load
from bot.adr.render import render
from bot.adr.workload import WorkloadShape, context_line
from bot.app.scheduler.jobs import before_runs_for
from bot.app.scheduler.workload_drift import LiveShape, WorkloadDrift
from bot.app.server import Bot
from bot.canary import Workload
from bot.change.actuators import build
from bot.kernel import Settings, Target
from bot.kernel.chat import RETUNE
from bot.kernel.store import AdrDraft, buttons
from bot.kernel.store import service as store
from bot.remediation import run_gate
from bot.tune import ENDED, OFFERED, Offer, space_of

AGENT_STREAMS = 4
SYSTEM_PROMPT = 1536  # tokens every agent request opens with (its instructions and tools)
AGENT_PROMPT = 1792  # the system prompt and the agent's own turn
AGENT_OUTPUT = 16
WINDOW_PACES = 4  # the capture window: this many of the slowest agent request, at least
# requests a side in the re-validation's two canary runs (the before-run and the fix's): at 8 the
# U test said "not decided" about as often as "missed" for the same failing rule; at 16 it decides
REVALIDATION_REQUESTS = 16


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


def _revalidated(settings: Settings, name: str) -> Settings:
    """The settings the drift job runs with: the target's canary at REVALIDATION_REQUESTS."""
    target = settings.targets[name]
    canary = target.canary.model_copy(update={"num_requests": REVALIDATION_REQUESTS})
    targets = {**settings.targets, name: target.model_copy(update={"canary": canary})}
    return settings.model_copy(update={"targets": targets})


@dataclass(frozen=True)
class DriftShown:
    """What the second act showed, for the last screen."""

    rule: str  # the traffic the rule was kept under, in words
    live: str  # what production sends now, in words
    moved: list[str]  # the dimensions that drifted
    verdict: list[str]  # the rule's gates under the live traffic
    posted: bool  # the drift thread was posted
    before: str = ""  # the before-run on the live traffic: the rule's replaced flags, numbers
    next_step: str = ""  # what the thread offered next (a re-tune), "" when nothing
    incident: int | None = None  # the drift thread's incident
    retune: str = ""  # how the re-tune ended, as the thread says it ("" when none ran)
    retune_draft: str = ""  # the ADR it drafted for the live workload ("" when none)


async def run_second_act(
    bot: Bot,
    *,
    settings: Settings,
    name: str,
    adr_dir: Path,
    adr_id: str,
    pace_s: float,
    stop_load: Callable[[], Awaitable[None]],
) -> DriftShown:
    """One period of the drift job while the agents run; what it found.

    ``pace_s``: the slowest agent request measured here (sizes the capture window).
    ``stop_load``: stops the demo's traffic once the live shape is captured, so that the
    before-run and the canary replay it on the target alone, as the gate after a change does.
    """
    window = max(8.0, float(math.ceil(WINDOW_PACES * pace_s)))
    adrs = SharedAdrStore(root=adr_dir, db=bot.db)
    settings = _revalidated(settings, name)
    target = settings.targets[name]
    # the target allows a before-run (drift_before_run): the flags the rule replaced serve
    # for one canary run on the live shape, then the fix again, judged against it
    before_runs = before_runs_for(
        settings, name, db=bot.db, gate=run_gate, actuator_for=build, clock=None
    )

    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as http:
        live = LiveShape(http=http, window_s=window)

        async def captured(target_name: str, spec: Target) -> WorkloadShape:
            try:
                return await live(target_name, spec)
            finally:
                await stop_load()

        job = WorkloadDrift(
            name=name, target=target, listed=[], db=bot.db, adrs=adrs, gate=run_gate,
            flows=bot.flows, read_shape=captured, before_runs=before_runs, retune=bot.retune,
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
        before=str((detail.get("before_runs") or {}).get(adr_id, "")),
        posted=bool(detail.get("opened")),
        next_step=_offered(bot, detail.get("incident")),
        incident=detail.get("incident") if isinstance(detail.get("incident"), int) else None,
    )


async def run_retune(bot: Bot, shown: DriftShown, *, approver: str) -> DriftShown:
    """``approver`` presses the drift thread's Re-tune button (as in Slack); the search runs on
    the target, trial by trial, and ends with a draft for the live workload or with none. What
    the thread said at its end, and the draft's id."""
    incident_id = shown.incident
    assert incident_id is not None
    with bot.db.transaction() as s:
        token = buttons.live(s, buttons.subject(RETUNE, incident_id)).get(RETUNE)
    if token is None:
        return replace(shown, retune="not started: the thread's Re-tune button is gone")
    await bot.retune.press(user_id=approver, token=token, incident_id=incident_id)
    await bot.tasks.drain(timeout_s=1800)
    with bot.db.transaction() as s:
        ended = store.last_audit(s, incident_id, action=ENDED)
        draft = s.query(AdrDraft).filter_by(incident_id=incident_id).one_or_none()
        said = "did not end" if ended is None else str(ended.detail.get("text", ""))
        return replace(shown, retune=said, retune_draft="" if draft is None else draft.adr_id)


def console_line(text: str) -> str:
    """A thread message as a console line: no emoji codes, bold or code marks."""
    return re.sub(r":[a-z_]+: ", "", text).replace("*", "").replace("`", "")


def _offered(bot: Bot, incident_id: object) -> str:
    """The re-tune the drift thread offers, in words ("" when none was offered)."""
    if not isinstance(incident_id, int):
        return ""
    with bot.db.transaction() as s:
        entry = store.last_audit(s, incident_id, action=OFFERED)
        if entry is None:
            return ""
        offer = Offer.model_validate(entry.detail)
    tried = "; ".join(
        f"{flag} {', '.join(map(str, dim.values or []))}"
        for flag, dim in space_of(offer.fix, offer.replaced).items()
    )
    return (
        f"a re-tune of {offer.adr_id} on the live traffic ({tried}), with a "
        "[Re-tune on the live traffic] button for an approver"
    )
