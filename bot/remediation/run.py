"""One approved change, run by one runner: apply, canary, then keep or roll back.

Every step is a conditional state move on the card (``Card.step``): a run that lost the change
to another replica stops at its next step without touching the target again. The run holds
one actuator for the whole change (the caller builds it and closes it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict, cast

from bot.adr import BEFORE, NORMAL, Adr, AdrGates, GatewayRules, unlike_gate
from bot.canary import (
    DEFAULT_CONFIDENCE,
    CanaryReport,
    Guardrail,
    Samples,
    StandingGate,
    how_sure,
    standing,
    values_of,
    watch,
)
from bot.change import InForce, flags_text, verify_serving
from bot.change.actuators import Actuator, ActuatorError, Deployed, TakesContext
from bot.diagnosis import GATE_OF, Baseline
from bot.kernel import RuleloopError, Settings, Target, UsageError
from bot.kernel.numbers import catalogue
from bot.kernel.runtime import BotMetrics, annotate, new_error_id, traced
from bot.kernel.runtime.redact import redact
from bot.kernel.store import ACTIVE, ROLLBACK_FAILED, ChangeState, Remediation
from bot.remediation.card import Card
from bot.remediation.change_note import give_context
from bot.remediation.change_silence import ChangeSilencer
from bot.remediation.gate import GateRun, GateRunner
from bot.remediation.gateway_rules import GatewayAdmin
from bot.remediation.live_stage import LiveJudge, StageCount, judge_live
from bot.remediation.records import CanaryRecord, RemediationRecords

log = logging.getLogger("ruleloop.remediation")

S = ChangeState
PREVIOUS = "the previous flags"  # what a message says of an empty set of flags
Numbers = dict[str, float | None]
HOLD_BUTTONS = ("keep", "roll_back")  # a held change's card: a person decides
ENDS_SILENCE = (S.PROMOTED, S.ROLLED_BACK, S.FAILED)  # a change's silence is expired at these


class Kept(TypedDict):
    """What the record keeps of a canary that met the gates, or that a person kept when it
    could not decide them (each live step and the promotion write it): its numbers, the gates,
    how sure, and what the guardrails saw."""

    numbers: Numbers
    failures: list[str]
    missed: list[str]
    gates: dict[str, float]
    before_numbers: Numbers
    workload_shape: dict[str, object] | None
    how_sure: list[str]
    watched: list[str]  # guardrails worse than the before-run
    held: list[str]  # guardrails that held
    regressed: list[str]  # worse beyond noise
    undecided: NotRequired[list[str]]  # the gates the canary could not decide (a held change)
    kept_by: NotRequired[str]  # the person who kept it, undecided


@dataclass(frozen=True)
class Judging:
    """The gates a change is judged by, resolved once: the limits the canary checks and the
    before-run they were resolved against (None: none ran)."""

    gates: AdrGates
    ratios: dict[str, float] = field(default_factory=dict)  # 'Nx before' gates: name -> N
    before_report: CanaryReport | None = None  # the before-run, per-request values and all
    # the target's standing gates (the ADRs in force there), by gate name
    standing: dict[str, StandingGate] = field(default_factory=dict)

    @property
    def before(self) -> Numbers | None:
        """The before-run's numbers (what 'Nx before' multiplied, the card's "before")."""
        return None if self.before_report is None else values_of(self.before_report).numbers()

    @property
    def before_samples(self) -> Samples | None:
        """The before-run's per-request values ('Nx before' gates are judged on them)."""
        return None if self.before_report is None else self.before_report.samples

    def gated(self) -> set[str]:
        """The catalogue numbers a gate judges (the guardrails watch the others)."""
        limits = self.gates.limits()
        return {m.key for m in catalogue.METRICS if m.gate in limits}

    @property
    def limits(self) -> dict[str, float]:
        """The limits, as numbers (what the card and the record show, as JSON)."""
        return self.gates.limits()

    @property
    def confidence(self) -> float:
        """What the gates and the guardrails decide at: the ADR's, else 0.99."""
        return self.gates.confidence or DEFAULT_CONFIDENCE


def standing_gates(adr: Adr, in_force: InForce | None) -> dict[str, StandingGate]:
    """The target's standing gates while ``adr`` changes it: the strictest limit per number
    over the ADRs in force there ('Nx before' against the before-run of the change that put
    them in force), except ``adr`` itself and those it supersedes, by gate name."""
    if in_force is None:
        return {}
    replaced = {adr.id, *adr.supersedes}
    others = [a for a in in_force.adrs if a.id not in replaced]
    limits = Baseline.from_adrs(others, in_force.before).limits
    return {GATE_OF[key]: StandingGate(limit.value, limit.adr_id) for key, limit in limits.items()}


class ChangeRun:
    """Apply, canary, keep or roll back one change (``rem``) as ``runner``, with ``actuator``."""

    def __init__(
        self,
        *,
        rem: Remediation,
        runner: str,
        actuator: Actuator,
        settings: Settings,
        records: RemediationRecords,
        card: Card,
        gate: GateRunner,
        silencer: ChangeSilencer,
        live: LiveJudge = judge_live,
        metrics: BotMetrics | None = None,
    ) -> None:
        self.rem = rem
        self._metrics = metrics or BotMetrics()  # the bot's: each canary's verdict
        self.runner = runner
        self.actuator = actuator
        self.name, self.spec = settings.target(rem.target)
        self._hold_ttl_s = settings.remediation.hold_ttl_s
        self.before = Deployed.from_json(rem.before)
        self.flags = dict(rem.after["flags"])
        self._records = records
        self._card = card
        self._gate = gate
        self._silencer = silencer
        self._latest: Remediation | None = None  # the row as the last step wrote it
        self._unsaved: CanaryRecord | None = None  # a canary run the next step keeps
        self._adr: Adr | None = None  # read once by the run; the card shows it at each step
        self._live = live  # the live stage's judge of one window
        self._live_lines: list[str] = []  # what the live stage's steps said

    async def run(self, adr: Adr, in_force: InForce | None = None) -> None:
        """The whole change: each part returns None when it ended the change itself.
        ``in_force``: the ADRs in force on the target (their gates are its guardrails)."""
        self._adr = adr
        if not self.actuator.changes_flags:
            await self._step(
                S.DRY_RUN, "remediation.dry_run", {"flags": self.flags},
                note="dry run: the flags above would be set; nothing was changed",
                expect=[S.APPROVED],
            )  # fmt: skip
            return
        judging = await self._judging(adr, in_force)
        if judging is None:
            return
        deployed = await self._apply(adr, judging)
        if deployed is None:
            return
        result = await self._canary(adr, judging, deployed)
        if result is None:
            return
        kept = self._kept(result, judging)
        stage = self.spec.live_stage
        if await self._live_stage(kept, None if stage is None else StageCount(stage)):
            await self._keep(kept)

    async def go_on(self, adr: Adr, found: Remediation, *, kept_by: str | None = None) -> None:
        """Go on with a change whose canary was kept (``found``: the change as its last step
        wrote it): a live stage a stopped bot left between steps, from the first step it did
        not judge, or a held change a person kept (``kept_by``); then keep or roll back."""
        self._adr, self._latest = adr, found
        kept = cast(Kept, {key: value for key, value in found.result.items() if key != "live"})
        if kept_by is not None:
            kept["kept_by"] = kept_by
        stage = self.spec.live_stage
        count = None if stage is None else StageCount.of(stage, found.result.get("live") or [])
        if await self._live_stage(kept, count):
            await self._keep(kept)

    async def _judging(self, adr: Adr, in_force: InForce | None) -> Judging | None:
        """The gates, resolved once ('Nx before' ones against the same canary on the flags
        serving now); None when the change was refused (nothing was changed)."""
        assert adr.gates is not None  # the policy refused ADRs without gates
        try:
            like_for_like(adr.id, adr.gates)
            absolute = adr.gates.resolve({}, strict=False)
            ratios = {key: r.factor for key, r in adr.gates.relative(BEFORE).items()}
            was, report = None, None
            if self.spec.canary.baseline or ratios:
                measured = await self._baseline(adr, absolute, ratios)
                if measured is not None:
                    was, report = measured.values.numbers(), measured.report
            gates = adr.gates.resolve({}, before=was) if ratios else absolute
        except UsageError as exc:
            await self._step(
                S.CANCELLED, "remediation.cancelled", {"reason": str(exc)},
                note=f"nothing was changed: {exc}", expect=[S.APPROVED],
            )  # fmt: skip
            return None
        standing = standing_gates(adr, in_force)
        return Judging(gates=gates, ratios=ratios, before_report=report, standing=standing)

    @traced("before_run")
    async def _baseline(
        self, adr: Adr, absolute: AdrGates, ratios: dict[str, float]
    ) -> GateRun | None:
        """The same canary on the flags serving now: the matrix's "before" row, and what
        'Nx before' gates multiply, judged by the absolute gates only. None when it could not
        run (gates that need it then say so when they are resolved)."""
        await self._step(
            S.APPROVED, "remediation.baseline_started", {"flags": self.before.flags},
            note="measuring the current flags with the same canary first…", expect=[S.APPROVED],
        )  # fmt: skip
        try:
            result = await self._gate(
                self.before.base_url, self.spec.canary, absolute, shape=adr.workload,
                ratios=ratios,
            )  # fmt: skip
        except RuleloopError as exc:
            log.warning("baseline canary of remediation %s failed: %s", self.rem.id, exc)
            return None
        self._add_canary("before: " + flags_text(self.before.flags, none=PREVIOUS), result)
        return result

    @traced("apply")
    async def _apply(self, adr: Adr, judging: Judging) -> Deployed | None:
        """The flags (and gateway rules) on the canary stage; None when that failed (and the
        change was rolled back)."""
        await self._give_context(adr_title=adr.title, numbers=judging.before)
        # before the engine restarts: its alerts then are the change's (the card says which)
        await self._silencer.start(self.rem, link=await self._link())
        await self._step(
            S.APPLYING, "remediation.applying",
            {"flags": self.flags, "before": self.rem.before, "gates": judging.limits,
             "gates_as_written": adr.gates.describe(judging.gates) if adr.gates else {}},
            note=f"applying with the {self.actuator.kind} actuator…",
            result={"gates": judging.limits, "before_numbers": judging.before or {}},
            expect=[S.APPROVED],
        )  # fmt: skip
        try:
            deployed = await self.actuator.apply(self.flags)
            if self.rem.after.get("gateway") is not None:
                await self._gateway().apply(GatewayRules(**self.rem.after["gateway"]))
        except (ActuatorError, UsageError) as exc:
            await self.roll_back(reason=f"the change failed: {exc}", expect=[S.APPLYING])
            return None
        return deployed

    @traced("canary")
    async def _canary(self, adr: Adr, judging: Judging, deployed: Deployed) -> GateRun | None:
        """The canary on what the change deployed, judged once; None when it could not run or
        failed the gates (and the change was rolled back)."""
        canary = self.spec.canary
        replaying = ", replaying the workload the ADR was measured under" if adr.workload else ""
        await self._step(
            S.CANARY, "remediation.canary_started",
            {"base_url": redact(deployed.base_url), "flags": deployed.flags,
             "workload": canary.model_dump()},
            note=f"canary: {canary.num_requests} requests, {canary.concurrency} streams against "
            f"{deployed.base_url}{replaying}…",
            after=deployed.to_json(), expect=[S.APPLYING],
        )  # fmt: skip
        try:
            # An ADR that records the workload it was measured under is judged under it again,
            # before and after the change alike; otherwise the target's canary load.
            result = await self._gate(
                deployed.base_url, canary, judging.gates, shape=adr.workload,
                ratios=judging.ratios, before=judging.before_samples,
            )  # fmt: skip
        except RuleloopError as exc:
            self._metrics.canary_judged("error")
            annotate(verdict="error")
            reason = f"the canary could not run: {exc}"
            await self.roll_back(reason=reason, expect=[S.CANARY])
            return None
        self._metrics.canary_judged(*verdict_words(result))
        annotate(verdict=verdict_words(result)[0], passed=result.passed)
        label = f"{adr.id} on {self.name}: {flags_text(self.rem.change, none='', ordered=False)}"
        self._add_canary(label, result)
        if not result.passed and self._holds(adr, result):
            await self._hold(result, judging)
            return None
        if not result.passed:
            await self.roll_back(
                reason="canary failed the gates: " + "; ".join(result.failures),
                expect=[S.CANARY], judged=result,
            )  # fmt: skip
            return None
        watched = self._guardrails(result, judging)
        regressed = [w.text() for w in watched if w.regressed]
        if regressed and (adr.guardrails or canary.guardrails) == "block":
            await self.roll_back(
                reason="a guardrail blocked it: " + "; ".join(regressed),
                expect=[S.CANARY], judged=result, watched=watched,
            )  # fmt: skip
            return None
        return result

    @staticmethod
    def _holds(adr: Adr, result: GateRun) -> bool:
        """The canary decided no gate against the change, only left some undecided, and the
        ADR asks for a person then (``gates.inconclusive: hold``)."""
        failed = result.verdict.failed
        undecided = all(r.decided == "inconclusive" for r in failed)
        return (
            bool(failed)
            and undecided
            and adr.gates is not None
            and (adr.gates.inconclusive == "hold")
        )

    async def _hold(self, result: GateRun, judging: Judging) -> None:
        """Leave the change on the canary stage for a person: Keep (on to the live stage, if
        any, and the rollout) or Roll back, on the card until the hold expires (then the sweep
        rolls it back). The run ends here; nothing beats for a held change, and resume leaves
        it be."""
        ttl_s = self._hold_ttl_s
        kept = self._kept(result, judging) | {"undecided": list(result.failures)}
        watched = self._guardrails(result, judging)
        regressed = [w.text() for w in watched if w.regressed]
        worse = f" Worse beyond noise, ungated: {'; '.join(regressed)}." if regressed else ""
        await self._step(
            S.HELD, "remediation.held", {"undecided": result.failures, "hold_ttl_s": ttl_s},
            note=f"held for a person: the canary could not decide "
            f"{'; '.join(result.failures)}.{worse} Keep it or roll it back within "
            f"{ttl_s / 60:.0f} minutes; if nobody does, it is rolled back.",
            result=kept, expect=[S.CANARY], issue=HOLD_BUTTONS, issue_ttl_s=ttl_s, runner=None,
        )  # fmt: skip

    def _guardrails(self, result: GateRun, judging: Judging) -> list[Guardrail]:
        """What the change did to the numbers no gate names (none without a before-run), and
        the canary against the target's standing gates."""
        watched: list[Guardrail] = []
        if judging.before_report is not None:
            watched += watch(
                judging.before_report, result.report, gated=judging.gated(),
                band=self.spec.canary.guardrail_band, confidence=judging.confidence,
            )  # fmt: skip
        return watched + standing(result.report, judging.standing, confidence=judging.confidence)

    async def _live_stage(self, kept: Kept, count: StageCount | None) -> bool:
        """The target's live stage, if it has one (``bot.remediation.live_stage``): each step a
        window of production traffic on the canary stage against the baseline, from the first
        one ``count`` has not judged; False when it rolled the change back. Each step's record
        holds what promotion keeps (``kept``), so a bot that stops mid-stage can go on."""
        if count is None:
            return True
        return await self._live_steps(kept, count)

    @traced("live_stage")
    async def _live_steps(self, kept: Kept, count: StageCount) -> bool:
        """The live stage's steps ``count`` has not judged (``_live_stage``)."""
        stage = count.stage
        for step in range(len(count.lines) + 1, stage.steps + 1):
            await self._step(
                S.CANARY, "remediation.live_step", {"step": step, "of": stage.steps},
                note=f"live stage {step}/{stage.steps}: the canary replicas against the baseline "
                f"on production traffic for {stage.step_s:g} s…",
                result=kept | {"live": count.lines}, expect=[S.CANARY],
            )  # fmt: skip
            count.add(await self._live(self.name, self.spec, stage))
            why = count.failed()
            if why is not None:
                await self.roll_back(reason=why, expect=[S.CANARY], live=count.lines)
                return False
        self._live_lines = count.lines
        return True

    def _kept(self, result: GateRun, judging: Judging) -> Kept:
        """What the record keeps of a canary that met the gates, and shows once promoted."""
        numbers = result.values.numbers()
        watched = self._guardrails(result, judging)
        return Kept(
            numbers=numbers, failures=[], missed=[], gates=judging.limits,
            before_numbers=judging.before or {}, workload_shape=result.report.shape_json(),
            how_sure=how_sure(result.report),
            watched=[w.text() for w in watched if w.worse],
            held=[w.text() for w in watched if not w.worse],
            regressed=[w.text() for w in watched if w.regressed],
        )  # fmt: skip

    @traced("promote")
    async def _keep(self, kept: Kept) -> None:
        """The canary met the gates (and the live stage held): roll the change out beyond the
        canary stage."""
        numbers = kept["numbers"]
        await self._step(
            S.PROMOTING, "remediation.canary_passed", {"numbers": numbers},
            note=f"kept by {kept['kept_by']}; rolling out…" if "kept_by" in kept
            else "canary passed; rolling out…",
            result=kept | {"live": self._live_lines},
            expect=[S.CANARY],
        )  # fmt: skip
        try:
            await self.actuator.promote(self.flags)
        except ActuatorError as exc:
            await self.roll_back(reason=f"the rollout failed: {exc}", expect=[S.PROMOTING])
            return
        worse = kept.get("regressed") or []
        but = ("; but worse beyond noise, ungated: " + "; ".join(worse)) if worse else ""
        why = "the canary met every gate"
        if "kept_by" in kept:
            undecided = "; ".join(kept.get("undecided") or [])
            why = f"{kept['kept_by']} kept it, the canary undecided ({undecided})"
        await self._step(
            S.PROMOTED, "remediation.promoted",
            {"numbers": numbers, "flags": self.flags, "kept_by": kept.get("kept_by")},
            note=f"kept: {why}{but}", expect=[S.PROMOTING],
        )  # fmt: skip

    @traced("rollback")
    async def roll_back(
        self,
        *,
        reason: str,
        expect: list[ChangeState],
        judged: GateRun | None = None,
        watched: Sequence[Guardrail] = (),
        live: Sequence[str] = (),
    ) -> None:
        """Back to the recorded flags, from state ``expect``; ``judged`` is the canary that
        failed the gates, if one did (its numbers and workload stay on the record)."""
        current = self._latest or await self._records.get(self.rem.id)
        result = _rollback_result(current.result, reason, judged, watched)
        if live:
            result["live"] = list(live)
        await self._step(
            S.ROLLING_BACK, "remediation.rolling_back", {"reason": reason},
            note=f"{reason}; rolling back…", result=result, expect=expect,
        )  # fmt: skip
        try:
            if self.rem.before.get("gateway") is not None:
                await self._gateway().restore(self.rem.before["gateway"])
            await self._give_context(numbers=current.result.get("before_numbers"), reason=reason)
            restored = await self.actuator.rollback(self.before)
            await verify_serving(restored.base_url)
        except Exception as exc:
            error = (
                str(exc) if isinstance(exc, RuleloopError) else f"unexpected {type(exc).__name__}"
            )
            log.error("rollback of remediation %s failed", self.rem.id, exc_info=exc)
            await self._step(
                S.FAILED, ROLLBACK_FAILED, {"error": error},
                note=f"{reason}; the ROLLBACK FAILED: {error}. Manual action needed: restore "
                f"{flags_text(self.before.flags, none=PREVIOUS)} on {self.rem.target}.",
                expect=[S.ROLLING_BACK],
            )  # fmt: skip
            return
        await self._step(
            S.ROLLED_BACK, "remediation.rolled_back", {"flags": restored.flags},
            note=f"{reason}. Rolled back: {flags_text(restored.flags, none=PREVIOUS)} serve "
            "again.",
            expect=[S.ROLLING_BACK],
        )  # fmt: skip

    # --- parts ------------------------------------------------------------------------------
    async def _step(
        self, state: ChangeState, action: str, detail: dict[str, Any], *, note: str,
        expect: list[ChangeState], **fields: Any,
    ) -> None:  # fmt: skip
        ends = state in ENDS_SILENCE  # the change is over: its alerts are wanted again
        canary, self._unsaved = self._unsaved, None
        self._latest = await self._card.step(
            self.rem.id, state, action, detail, note=note, owner=self.runner, expect=expect,
            adr=self._adr, show=not ends, canary=canary, **fields,
        )  # fmt: skip
        if ends:  # shown once, with the silence as its end left it
            self._latest = await self._silencer.end(self._latest)
            await self._card.show(self._latest, note=redact(note), adr=self._adr)

    def _add_canary(self, label: str, result: GateRun) -> None:
        """Keep the canary's report with the incident (the draft's matrix reads it): written
        with the step that follows it, in its transaction (every canary is followed by one)."""
        assert self._unsaved is None, "a canary run was not kept"
        self._unsaved = CanaryRecord(label=label, passed=result.passed, report=result.report)

    @property
    def latest(self) -> Remediation | None:
        """The remediation as this run's last step wrote it (None before its first)."""
        return self._latest

    async def _give_context(
        self, *, adr_title: str = "", numbers: Numbers | None = None, reason: str = ""
    ) -> None:
        """The change's story for an actuator that records it (a git commit, a pull request)."""
        if not isinstance(self.actuator, TakesContext):
            return
        link = await self._link()
        give_context(
            self.actuator, self.rem, before=self.before, adr_title=adr_title, link=link,
            numbers=numbers, reason=reason,
        )  # fmt: skip

    async def _link(self) -> str | None:
        """The card's link, if Slack gives one: only a link, never a reason to stop a change."""
        with contextlib.suppress(Exception):
            return await self._card.permalink(self.rem)
        return None

    def _gateway(self) -> GatewayAdmin:
        return gateway_admin(self.name, self.spec)


async def crashed(card: Card, remediation_id: int, exc: BaseException, *, owner: str) -> None:
    """An unexpected error stopped the run: the card says so (check the flags by hand)."""
    error_id = new_error_id()
    log.error("remediation %s failed (id %s)", remediation_id, error_id, exc_info=exc)
    text = str(exc) if isinstance(exc, RuleloopError) else f"unexpected error (id {error_id})"
    with contextlib.suppress(Exception):
        await card.step(
            remediation_id, S.FAILED, "remediation.failed", {"error": text},
            note=f"stopped: {text}. Check the target's flags by hand.", owner=owner,
            expect=sorted(ACTIVE),
        )  # fmt: skip


def gateway_admin(name: str, spec: Target) -> GatewayAdmin:
    """The target's gateway admin API; UsageError when the target has none configured."""
    if spec.gateway_url is None or spec.gateway_admin_token_file is None:
        raise UsageError(
            f"the ADR has gateway rules but target {name!r} has no gateway_url and "
            "gateway_admin_token_file to apply them with"
        )
    return GatewayAdmin(url=spec.gateway_url, token_file=spec.gateway_admin_token_file)


def verdict_words(result: GateRun) -> tuple[str, list[tuple[str, str]]]:
    """A canary run's verdict in a word, and each gate's (name, word): met, missed, or
    inconclusive (the statistics could not decide it). The run is missed when a gate is,
    inconclusive when none is but one is undecided, else met."""
    gates: list[tuple[str, str]] = [
        (r.name, r.decided or ("met" if r.passed else "missed")) for r in result.verdict.results
    ]
    words = {word for _, word in gates}
    run = "missed" if "missed" in words else "inconclusive" if "inconclusive" in words else "met"
    return run, gates


def like_for_like(adr_id: str, gates: AdrGates) -> None:
    """Refuse gates that would compare unlike numbers (relative to the engine's normal)."""
    unlike = [unlike_gate(key, value) for key, value in gates.relative(NORMAL).items()]
    if unlike:
        raise UsageError(f"{adr_id}'s gates cannot be checked like for like: " + "; ".join(unlike))


def _rollback_result(
    kept: dict[str, Any], reason: str, judged: GateRun | None, watched: Sequence[Guardrail] = ()
) -> dict[str, Any]:
    """The record's result for a rollback: why, the failed canary's numbers, the gates it
    missed (by name: ``missed``; in words: ``failures``), and what the change was judged by
    (the resolved limits and the judging canary's workload stay)."""
    numbers = judged.values.numbers() if judged is not None else {}
    failures = judged.failures if judged is not None else []
    missed = [r.name for r in judged.verdict.failed] if judged is not None else []
    result = {"numbers": numbers, "failures": failures, "missed": missed, "reason": reason}
    if judged is not None:
        result["how_sure"] = how_sure(judged.report)
    if watched:
        result["watched"] = [w.text() for w in watched if w.worse]
    for key in ("gates", "before_numbers", "workload_shape"):
        if key in kept:
            result[key] = kept[key]
    shape = judged.report.shape_json() if judged is not None else None
    if shape is not None:
        result["workload_shape"] = shape
    return result
