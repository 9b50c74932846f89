"""The next step after a rule fails on the live workload: a tuning search for the flags that
serve production's new traffic, offered in the drift thread (or started at once).

The drift job re-validated a rule in force under the live shape and its gates failed there
(bot/app/scheduler/workload_drift.py). ``Retune.offer`` posts, in that thread, what a search
would do and a **Re-tune on the live traffic** button; with ``[targets.X.drift] retune = "auto"``
it starts at once. The search is `ruleloop tune --target` (``bot.tune.on_target``): the same
hold on the target, audit, restore after every trial and at the end, and resume by the next bot
after a kill -9. Its plan (``retune_plan``):

- space: each number the rule's fix sets, at a quarter, half, as set and twice, and the value
  it replaced; each on/off flag both ways (the grid, at most ``retune_trials`` points);
- workload: the live shape, replayed by every trial's canary (one replica's share), for
  as long as the re-validation replayed it (``[targets.X.canary] replay_s``), at its rate, or
  as many requests as it replayed;
- gates: the rule's gates as the re-validation judged them: numbers, and a 'Nx before' gate
  two-sample against the before-run's per-request values (the replaced flags on the same live
  shape), the re-validation's judge, not a p99 point a rule could then fail on; the draft keeps
  'Nx before' as written;
- objective: goodput (requests/s that finished within the TTFT and TPOT limits);
- match and cause: the failed rule's, so that the draft answers the same symptom, on the workload
  it was proven on (its ``workload:``); without them a drafted rule would never be offered.

Who may start it: the drift job proposes, a person in ``[access] approve`` approves by pressing
(the button is the approval of a change the bot requested, as an Apply is a request that an
approver approves). With ``auto`` the setting is the approval.

Its result is a proposed ADR, posted for review in the thread: the best trial's flags as the fix,
every trial a matrix row, and ``workload:`` the live shape it was proven on, so it answers that
traffic and the rule before it keeps answering its own (bot/adr/match.py, ``by_workload``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from bot.adr import BEFORE, Adr, AdrGates, AdrStore, Condition, EngineValue, Relative
from bot.adr.workload import WorkloadShape, context_line
from bot.adr.workload import shape as shapes
from bot.canary import Samples, Values
from bot.change import flags_text
from bot.change.actuators import ActuatorFactory, opened
from bot.kernel import NotAllowed, RuleloopError, Settings, UsageError
from bot.kernel.chat import RETUNE, escape, mention
from bot.kernel.numbers import show
from bot.kernel.runtime import Members, TaskSupervisor, new_error_id, who_may
from bot.kernel.store import Database, buttons
from bot.kernel.store import outbox as items
from bot.kernel.store import service as store
from bot.tune.draft import build_draft
from bot.tune.objective import Objective
from bot.tune.on_target import Approval, tune_target
from bot.tune.plan import SearchSettings, TunePlan, WorkloadSpec
from bot.tune.records import TuneRecords
from bot.tune.service import search_context
from bot.tune.space import SearchDimension

log = logging.getLogger("ruleloop.tune")
OFFERED = "retune.offered"  # the audit entry that keeps an offer (what a press starts)
ENDED = "retune.ended"  # the audit entry that keeps how a re-tune ended (its last words)
DRIFT_JOB = "ruleloop (drift job)"  # who requests a re-tune: the bot, on its drift thread
# builds the draft's ADR once its id and day are known (DraftService.propose stores and posts it)
Build = Callable[[str, dt.date], Adr]
Propose = Callable[[int, str, Build], Awaitable[str]]  # incident, author, build -> its ADR id
RenderButtons = Callable[..., Mapping[str, object]]
MAX_SHOWN = 5  # trials a failed search names in the thread


class Offer(BaseModel):
    """What a re-tune would search: the rule that failed on ``target``, the gates as judged
    there (numbers), the flags serving before the rule and the live shape; the rule's match
    conditions and cause, which the draft keeps (the same symptom, another workload). The
    offer's audit entry keeps it as JSON (``model_dump``); a press reads it back
    (``model_validate``)."""

    model_config = ConfigDict(frozen=True)

    target: str
    adr_id: str
    fix: dict[str, EngineValue]
    gates: dict[str, float]
    replaced: dict[str, EngineValue]
    live: WorkloadShape
    match: list[Condition] = []  # the failed rule's conditions (an offer kept before: none)
    cause: list[str] = []
    replay_s: float = 0.0  # how long the re-validation replayed the live shape (0: a count)
    replay_requests: int = 0  # its count, where it replayed one (0: the target's canary's)
    # the rule's 'Nx before' gates (name -> N) and the before-run's per-request values (the
    # replaced flags on the live shape): trials are judged two-sample against them, as the rule was
    ratios: dict[str, float] = {}
    before: Samples | None = None

    def written_gates(self) -> AdrGates:
        """The gates a draft keeps: the numbers as judged, an 'Nx before' gate as written."""
        relative = {name: Relative(n, BEFORE) for name, n in self.ratios.items()}
        return AdrGates.of_numbers(self.gates).model_copy(update=relative)


def space_of(
    fix: Mapping[str, EngineValue], replaced: Mapping[str, EngineValue]
) -> dict[str, SearchDimension]:
    """The values a re-tune tries for each flag the rule's fix sets: a number at a quarter,
    half, as set and twice, and the value it replaced; an on/off flag both ways."""
    space: dict[str, SearchDimension] = {}
    for flag, value in fix.items():
        if isinstance(value, bool):
            space[flag] = SearchDimension(values=[False, True])
        elif isinstance(value, int):
            was = replaced.get(flag)
            tried = {max(1, value // 4), max(1, value // 2), value, value * 2}
            if isinstance(was, int) and not isinstance(was, bool):
                tried.add(was)
            space[flag] = SearchDimension(values=sorted(tried))
    return space


def retune_plan(offer: Offer, *, serving: Mapping[str, EngineValue], shape_path: Path,
                concurrency: int, num_requests: int, trials: int,
                replay_s: float = 0.0) -> TunePlan:  # fmt: skip
    """The search's plan (see the module docstring); UsageError when there is nothing to
    search or nothing to judge it by."""
    space = space_of(offer.fix, offer.replaced)
    if not space:
        raise UsageError(f"{offer.adr_id}'s fix sets no number or on/off flag a search can vary")
    if not offer.gates:
        raise UsageError(
            f"{offer.adr_id}'s gates were not judged as numbers on the live traffic (a 'Nx "
            "before' gate needs [targets.X.canary] drift_before_run = true): nothing to tune for"
        )
    return TunePlan(
        title=f"{offer.target}: {offer.adr_id}'s flags re-tuned for the live workload",
        context=(
            f"{offer.adr_id} failed its gates on {offer.target}'s live workload "
            f"({context_line(offer.live)}); this search looked for the flags that meet them there."
        ),
        deciders=[DRIFT_JOB],
        baseline={k: v for k, v in serving.items() if k not in space},
        space=space,
        objective=Objective(maximize="goodput_rps"),
        search=SearchSettings(sampler="grid", trials=trials),
        workload=WorkloadSpec(
            concurrency=concurrency,
            num_requests=num_requests,
            shape=shape_path,
            duration_s=replay_s or None,
            warmup_requests=min(concurrency, 4),
        ),  # fmt: skip
        gates=AdrGates.of_numbers(offer.gates),
        ratios=dict(offer.ratios),
        before=offer.before,
        match=list(offer.match),
        cause=list(offer.cause),
    )


class Retune:
    """Offers, starts and reports the re-tune of a rule that failed on the live workload."""

    def __init__(
        self,
        *,
        settings: Settings,
        db: Database,
        adrs: AdrStore,
        clock: Callable[[], dt.datetime],
        members: Members,
        tasks: TaskSupervisor,
        deliver: Callable[[int], Awaitable[object]],
        render: RenderButtons,
        propose: Propose,
        actuator_for: ActuatorFactory,
        runs_dir: Path,
    ) -> None:
        self._settings, self._db, self._adrs, self._clock = settings, db, adrs, clock
        self._members, self._tasks, self._deliver, self._render = members, tasks, deliver, render
        self._propose, self._actuator_for, self._runs_dir = propose, actuator_for, runs_dir
        self.records = TuneRecords(db=db, clock=clock)

    async def offer(self, incident_id: int, offer: Offer) -> None:
        """Say in the drift thread what a re-tune would do, with its button (``button``), or
        start it (``auto``); nothing where the target's ``retune`` is ``off``, or where its
        actuator cannot change its flags (none, or dry-run)."""
        target = self._settings.targets[offer.target]
        mode = target.drift.retune
        if mode == "off" or target.actuator is None or not target.actuator.changes_flags:
            return
        space = space_of(offer.fix, offer.replaced)
        tried = "; ".join(
            f"{flag} {', '.join(str(v) for v in dim.values or [])}" for flag, dim in space.items()
        )
        what = (
            f":wrench: *Next step:* a tuning search for flags that meet {offer.adr_id}'s gates on "
            f"this traffic: {tried or 'nothing to vary'}, each trial on the canary stage "
            "replaying the live shape, the flags serving now restored after each"
        )
        if mode == "auto":
            await asyncio.to_thread(self._say, incident_id, what + " (starting: retune = auto)",
                                    OFFERED, offer.model_dump(mode="json"))  # fmt: skip
            approval = Approval(DRIFT_JOB, [f"[targets.{offer.target}.drift] retune = auto"])
            self._start(incident_id, offer, approval)
        else:
            note = what + f". An approver ({who_may(self._settings.access.approve)}) starts it."
            await asyncio.to_thread(self._offer_button, incident_id, note, offer)
        await self._deliver(incident_id)

    async def press(self, *, user_id: str, token: str, incident_id: int) -> None:
        """The Re-tune button: an approver starts the search offered in this thread, once."""
        if not (await self._members()).allows("approve", user_id):
            raise NotAllowed(
                "Starting a re-tune changes the target's flags trial by trial: an approver "
                f"starts it ({who_may(self._settings.access.approve)}). Nothing was changed."
            )
        offer = await asyncio.to_thread(self._claim, incident_id, token, user_id)
        self._start(incident_id, offer, Approval(DRIFT_JOB, [user_id]))

    def _start(self, incident_id: int, offer: Offer, approval: Approval) -> None:
        self._tasks.spawn(self._run(incident_id, offer, approval),
                          name=f"re-tune of {offer.adr_id} on {offer.target}")  # fmt: skip

    async def _run(self, incident_id: int, offer: Offer, approval: Approval) -> None:
        """The search, then its draft for review in the thread; any failure said there."""
        who = ", ".join(a if a.startswith("[") else mention(a) for a in approval.approved_by)
        try:
            text = await self._search(incident_id, offer, approval, who)
        except RuleloopError as exc:
            why = escape(str(exc))
            text = f":warning: The re-tune of {offer.adr_id} did not run to its end: {why}"
        except Exception:
            error_id = new_error_id()
            log.exception("re-tune of %s on %s failed (id %s)", offer.adr_id, offer.target,
                          error_id)  # fmt: skip
            text = (
                f":warning: The re-tune of {offer.adr_id} failed: unexpected error (id "
                f"{error_id}; see the bot's log). The target's flags were restored."
            )
        await asyncio.to_thread(self._say, incident_id, text, ENDED, {"text": text})
        await self._deliver(incident_id)

    async def _search(self, incident_id: int, offer: Offer, approval: Approval, who: str) -> str:
        name, spec = self._settings.target(offer.target)
        runs = self._runs_dir / f"retune-{incident_id}-{offer.adr_id}"
        runs.mkdir(parents=True, exist_ok=True)
        shape_path = runs / "live-shape.yaml"
        shapes.save(offer.live, shape_path)
        async with opened(self._actuator_for, name, spec) as actuator:
            serving = (await actuator.current()).flags
        plan = retune_plan(
            offer, serving=serving, shape_path=shape_path, concurrency=spec.canary.concurrency,
            num_requests=offer.replay_requests or spec.canary.num_requests,
            trials=spec.drift.retune_trials,
            replay_s=offer.replay_s,  # as the re-validation replayed it: like for like
        )  # fmt: skip
        await asyncio.to_thread(
            self._say, incident_id, f":hourglass_flowing_sand: Re-tune of {offer.adr_id} started "
            f"(approved by {who}): {_trials(plan.search.budget(plan.search_space()))} on {name}…",
            "retune.started", {"approved_by": approval.approved_by},
        )  # fmt: skip
        await self._deliver(incident_id)
        session = await tune_target(
            plan, settings=self._settings, records=self.records, target=name, approval=approval,
            runs_dir=runs, echo=lambda line: log.info("re-tune %s: %s", offer.adr_id, line),
            actuator_for=self._actuator_for,
        )  # fmt: skip
        result = session.result
        where = _where(offer, plan, session.actuator, name, session.before.flags)

        def build(adr_id: str, day: dt.date) -> Adr:
            draft = build_draft(
                plan, result.rows, adr_id=adr_id, day=day, runs_dir=runs,
                base=self._adrs.drafts_dir, how=search_context(plan, result, where=where),
            )  # fmt: skip
            return draft.model_copy(update={"gates": offer.written_gates()})

        if result.pick is None:
            return (
                f":x: Re-tune of {offer.adr_id}: {_none_met(len(result.rows))} the gates "
                "on the live traffic; the flags serving now were restored. No draft: nothing "
                "proven. "
                + "; ".join(
                    f"`{flags_text(dict(row.config.changes))}`: {row.verdict()}"
                    for row in result.rows[:MAX_SHOWN]
                )
            )
        adr_id = await self._propose(incident_id, DRIFT_JOB, build)
        best = result.pick
        return (
            f":white_check_mark: Re-tune of {offer.adr_id}: {len(result.rows)} trials; the best "
            f"that met the gates: `{flags_text(dict(best.config.changes))}`"
            f"{_numbers(best.values)}. "
            f"Drafted *{adr_id}*, proven on the live workload ({context_line(offer.live)}); "
            f"{offer.adr_id} keeps its own. Both stand: at an incident the one whose workload "
            "production sends is offered."
        )

    def _offer_button(self, incident_id: int, note: str, offer: Offer) -> None:
        now = self._clock()
        with self._db.transaction() as s:
            tokens = buttons.issue(s, buttons.subject(RETUNE, incident_id), [RETUNE],
                                   incident_id=incident_id, now=now)  # fmt: skip
            incident = store.get(s, incident_id)
            store.audit(s, at=now, actor="ruleloop", action=OFFERED, incident=incident,
                        detail=offer.model_dump(mode="json"))  # fmt: skip
            items.owe_root(s, incident_id, at=now, channel=None)  # the thread's, owed once
            items.owe(s, incident_id, kind=items.REPLY, at=now,
                      payload=self._render(tokens, note=note))  # fmt: skip

    def _say(self, incident_id: int, text: str, action: str, detail: Mapping[str, object]) -> None:
        now = self._clock()
        with self._db.transaction() as s:
            store.audit(s, at=now, actor="ruleloop", action=action,
                        incident=store.get(s, incident_id), detail=detail)  # fmt: skip
            items.owe_root(s, incident_id, at=now, channel=None)  # the thread's, owed once
            items.owe(s, incident_id, kind=items.REPLY, at=now, payload={"text": text})

    def _claim(self, incident_id: int, token: str, user_id: str) -> Offer:
        """Use the button with its audit entry; the offer it starts (UsageError when someone
        else pressed it first, the drift is over, or the offer is gone)."""
        now = self._clock()
        with self._db.transaction() as s:
            incident = store.get(s, incident_id)
            if incident is not None and incident.status == store.RESOLVED:
                raise UsageError(
                    "The drift is over: production sends the rule's traffic again (this thread "
                    "is resolved), so there is nothing to re-tune for. Nothing was changed."
                )
            if not buttons.use(s, token, user_id=user_id, now=now):
                raise UsageError("Someone else pressed this button first. Nothing was changed.")
            offered = store.last_audit(s, incident_id, action=OFFERED)
            if incident is None or offered is None:
                raise UsageError("This re-tune's offer is gone. Nothing was changed.")
            offer = Offer.model_validate(offered.detail)
            store.audit(s, at=now, actor=user_id, action="retune.approved", incident=incident,
                        detail={"token": token[:6], "adr": offer.adr_id})  # fmt: skip
            return offer


def _trials(n: int) -> str:
    return "1 trial" if n == 1 else f"{n} trials"


def _none_met(trials: int) -> str:
    """'none of 5 trials met', 'its one trial did not meet'."""
    return "its one trial did not meet" if trials == 1 else f"none of {trials} trials met"


def _where(
    offer: Offer, plan: TunePlan, actuator: str, name: str, before: Mapping[str, EngineValue]
) -> str:
    """Where and how the trials ran, for the draft's context."""
    where = (
        f"on target {name} through its {actuator} actuator (the canary stage where it has one), "
        f"each trial rolled back before the next and {flags_text(before)} restored at the end"
    )
    if not plan.ratios:
        return where
    ratios = ", ".join(f"{Relative(n, BEFORE)} ({name})" for name, n in plan.ratios.items())
    return where + (
        f"; each trial's {ratios} judged two-sample against the before-run of "
        f"{flags_text(offer.replaced)} on the same live shape, as the re-validation judged the "
        "rule (the draft keeps that gate as written)"
    )


def _numbers(values: Values | None) -> str:
    """' (TTFT p99 120ms, TPOT p99 9.1ms, goodput 98%)': what the best trial measured."""
    if values is None:
        return ""
    shown = [
        f"{label} {show(key, value)}"
        for key, label in (("ttft_p99_ms", "TTFT p99"), ("tpot_p99_ms", "TPOT p99"),
                           ("goodput_ratio", "goodput"))
        if (value := getattr(values, key)) is not None
    ]  # fmt: skip
    return f" ({', '.join(shown)})" if shown else ""
