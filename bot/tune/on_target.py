"""Tuning on a real target: each trial's flags through the target's actuator (its canary stage,
where it has one), measured by the plan's canary, rolled back before the next trial; the flags
that served before are restored at the end whatever happens.

A session is a change to the target, so it is held to a change's rules:

- approved like an apply (``Policy.check_tuning``: requester with ``apply``, an approver with
  ``approve``, a second person under the two-person rule);
- one change at a time per target (``exclusion``): it does not start while a remediation or
  another session is in flight there, and holds the target against both while it runs;
- recorded before its first change (``TuneRecords.begin``, with ``before``, the actuator's
  record of what served), every trial written before it changes the target, with heartbeats;
- restored by whoever finds it silent: this process at the end (or on Ctrl-C / SIGTERM), else
  `ruleloop tune --target NAME --restore`, or the bot's resume (``SessionRestorer``, through
  bot.change.resume) after a kill -9, which rolls back to ``before`` exactly as a stopped
  remediation is rolled back.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import getpass
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bot.adr.workload import WorkloadShape
from bot.change import (
    Beat,
    LostRun,
    Policy,
    TargetBusy,
    beating,
    flags_text,
    tuning_refusal,
    verify_serving,
)
from bot.change.actuators import Actuator, ActuatorError, ActuatorFactory, Deployed, opened
from bot.kernel import EngineError, RuleloopError, Settings, Target, UsageError
from bot.kernel.runtime import process_alive, replica_id
from bot.kernel.store import ROLLBACK_FAILED, Change, TuneSession
from bot.tune.matrix import TrialRow
from bot.tune.objective import TrialOutcome
from bot.tune.plan import Config, TunePlan
from bot.tune.records import TuneRecords
from bot.tune.runner import measure_canary
from bot.tune.search import Search, TrialProposal
from bot.tune.session import Echo, SearchResult, make_search, run_search

log = logging.getLogger("ruleloop.tune")


class RestoreFailed(RuleloopError):
    """The target could not be put back to what served before the session: manual action."""


@dataclass(frozen=True)
class Approval:
    """Who asked for a session and who approved it (checked by ``Policy.check_tuning``)."""

    requested_by: str
    approved_by: list[str]


def approve(
    settings: Settings, target: str, *, requested_by: str | None, approved_by: list[str]
) -> Approval:
    """The session's approval, or NotAllowed/UsageError naming who is missing."""
    approvers = Policy(settings).check_tuning(
        target=target, requested_by=requested_by, approved_by=approved_by
    )
    assert requested_by is not None
    return Approval(requested_by=requested_by, approved_by=approvers)


def check_target(name: str, spec: Target, plan: TunePlan) -> None:
    """Refuse what a session on ``name`` could not do well, before anything is recorded."""
    if spec.actuator is None:
        raise UsageError(
            f"target {name!r} has no actuator, so ruleloop cannot change its flags to measure "
            f'them; configure [targets.{name}.actuator] kind = "local" | "kubernetes" | "git"'
        )
    if not spec.actuator.changes_flags:
        raise UsageError(
            f"target {name!r} has a dry-run actuator: it changes nothing, so every trial would "
            "measure the flags serving now; tune it with a local, kubernetes or git actuator"
        )
    if plan.gates is None or plan.gates.is_empty():
        raise UsageError(
            f"tuning {name} needs gates (the constraints every trial is judged by, and the "
            "release gate of the draft): add gates: to the plan or pass --gates-from ADR-ID. "
            "Nothing was changed."
        )
    relative = plan.gates.relative()
    if relative:
        names = ", ".join(f"{k}: {v}" for k, v in relative.items())
        raise UsageError(
            f"tuning {name} needs absolute gates; {names} is relative to a measurement the "
            "session does not make: write the limit as a number. Nothing was changed."
        )


class TargetTrials:
    """The target's trials: measured through its actuator, each written to the session's
    record before it changes the target and after it was put back (``Measurer`` and
    ``Journal`` of ``bot.tune.session``)."""

    def __init__(
        self,
        *,
        plan: TunePlan,
        actuator: Actuator,
        before: Deployed,
        records: TuneRecords,
        session_id: int,
        runner: str,
        echo: Echo,
    ) -> None:
        self.plan = plan
        self.actuator = actuator
        self.before = before
        self.records = records
        self.session_id = session_id
        self.runner = runner
        self.echo = echo
        self._trial: dict[str, Any] = {}
        # whether ``before`` is known to serve: false from a trial's apply until its rollback
        # worked (a stage's flags are not what ``current()`` reads: a Deployment's canary)
        self.rolled_back = True

    async def trial_started(self, proposal: TrialProposal, config: Config) -> None:
        """Written before the trial changes the target."""
        self._trial = {"number": proposal.number, "config": config.name,
                       "flags": dict(config.engine_args), "phase": "applying"}  # fmt: skip
        await self._write("tune.trial_started", {"trial": dict(self._trial)}, trial=self._trial)

    async def measure(self, config: Config, tag: str) -> TrialRow:
        """Apply, measure, roll back; RestoreFailed when the rollback did not work."""
        try:
            self.echo(f"{tag}: applying with the {self.actuator.kind} actuator…")
            self.rolled_back = False
            try:
                deployed = await self.actuator.apply(dict(config.engine_args))
            except (ActuatorError, UsageError) as exc:
                cause = exc.__cause__
                refused = isinstance(cause, EngineError) and cause.refused
                self.echo(f"{tag}: {'refused' if refused else 'did not apply'}: {exc}")
                return TrialRow(config, error=str(exc), failed_at="refused" if refused else "start")
            await self._phase("measuring", base_url=deployed.base_url)
            return await measure_canary(
                self.plan, config, deployed.base_url, tag=tag, echo=self.echo
            )
        finally:
            # also when the trial was cancelled (Ctrl-C, SIGTERM): the target goes back first,
            # even when the store does not answer (a restorer later rolls back once more)
            try:
                await self._phase("restoring")
            except LostRun:
                raise
            except Exception:
                log.exception("tuning session %s: cannot record the restore", self.session_id)
            self.echo(f"{tag}: rolling back to {flags_text(self.before.flags)}…")
            await restore_target(self.actuator, self.before)
            self.rolled_back = True

    async def trial_ended(
        self, proposal: TrialProposal, row: TrialRow, result: TrialOutcome
    ) -> None:
        """Written once the trial's numbers are in and the target serves ``before`` again."""
        summary = {
            "number": proposal.number,
            "config": row.config.name,
            "flags": dict(row.config.engine_args),
            "verdict": row.verdict(),
            "score": result.value,
            "feasible": result.feasible,
            "failed": result.failed,
        }
        self._trial = {}
        await self._write("tune.trial_ended", {"trial": summary}, trial={})

    async def _phase(self, phase: str, **extra: Any) -> None:
        self._trial = {**self._trial, "phase": phase, **extra}
        await self._write(f"tune.trial_{phase}", {"trial": dict(self._trial)}, trial=self._trial)

    async def _write(self, action: str, detail: dict[str, Any], **fields: Any) -> None:
        moved = await self.records.step(
            self.session_id, action=action, detail=detail, owner=self.runner, **fields
        )
        if not moved:
            raise LostRun(f"tuning session {self.session_id} is no longer run by {self.runner}")


async def restore_target(actuator: Actuator, before: Deployed) -> Deployed:
    """Roll back to ``before`` and check it serves (a completion, not just /health) with the
    recorded flags; RestoreFailed says what to restore by hand."""
    try:
        restored = await actuator.rollback(before)
        await verify_serving(restored.base_url)
    except Exception as exc:
        why = str(exc) if isinstance(exc, RuleloopError) else f"unexpected {type(exc).__name__}"
        raise RestoreFailed(
            f"the ROLLBACK FAILED: {why}. Manual action needed: restore {flags_text(before.flags)}"
        ) from exc
    if restored.flags != before.flags:
        raise RestoreFailed(
            f"after the rollback the target runs {flags_text(restored.flags)}, not the "
            f"recorded {flags_text(before.flags)}. Manual action needed."
        )
    return restored


@dataclass(frozen=True)
class TargetSession:
    """A finished session: its record's id, the search's result, what serves again."""

    session_id: int
    result: SearchResult
    before: Deployed
    actuator: str


async def tune_target(
    plan: TunePlan,
    *,
    settings: Settings,
    records: TuneRecords,
    target: str,
    approval: Approval,
    runs_dir: Path,
    echo: Echo,
    actuator_for: ActuatorFactory,
) -> TargetSession:
    """Run the plan's search on ``target``; the target serves ``before`` again when this
    returns or raises (RestoreFailed when it could not be put back)."""
    name, spec = settings.target(target)
    search = make_search(plan, plan.search_space())
    await _refuse_unless_free(records, plan, name, spec)
    async with opened(actuator_for, name, spec) as actuator:
        before = await actuator.current()
        runner = replica_id()
        session = await _begin(records, plan, search, name, approval, before, runner=runner)
        echo(
            f"tuning session #{session.id} on {name} ({actuator.kind} actuator), requested by "
            f"{approval.requested_by}, approved by {', '.join(approval.approved_by)}; serving now: "
            f"{flags_text(before.flags)} (restored after every trial and at the end)"
        )
        trials = TargetTrials(
            plan=plan, actuator=actuator, before=before, records=records, session_id=session.id,
            runner=runner, echo=echo,
        )  # fmt: skip

        every_s = settings.remediation.heartbeat_s
        try:
            async with beating(
                _beat(records, session.id, runner), every_s=every_s,
                name=f"tuning session {session.id}",
            ):  # fmt: skip
                result = await run_search(
                    plan, search, trials, runs_dir=runs_dir, echo=echo, journal=trials
                )
        except LostRun:
            raise UsageError(
                f"tuning session #{session.id} was taken over by another process (it found the "
                "session silent and restores the target): this one stopped without touching it"
            ) from None
        except BaseException as exc:  # Ctrl-C, SIGTERM, a crash: the target goes back first
            with contextlib.suppress(LostRun):
                await finish(records, session.id, actuator, before, runner=runner,
                             reason=f"stopped: {_why(exc)}", echo=echo,
                             rolled_back=trials.rolled_back)  # fmt: skip
            raise
        best = result.pick.config.name if result.pick else None
        await finish(records, session.id, actuator, before, runner=runner, echo=echo,
                     reason="finished", result={"trials": len(result.rows), "best": best},
                     rolled_back=trials.rolled_back)  # fmt: skip
        return TargetSession(
            session_id=session.id, result=result, before=before, actuator=actuator.kind
        )


async def _refuse_unless_free(
    records: TuneRecords, plan: TunePlan, name: str, spec: Target
) -> None:
    """UsageError for a target the plan cannot tune, or one a change or session holds now
    (refused before the actuator is asked anything)."""
    check_target(name, spec, plan)
    busy = await records.in_flight(name)
    if busy is not None:
        raise UsageError(tuning_refusal(name, busy))


def _beat(records: TuneRecords, session_id: int, runner: str) -> Beat:
    """The session's heartbeat, so another process restores the target only once it is dead."""

    async def beat() -> bool:
        return await records.heartbeat(session_id, runner=runner)

    return beat


async def _begin(
    records: TuneRecords,
    plan: TunePlan,
    search: Search,
    name: str,
    approval: Approval,
    before: Deployed,
    *,
    runner: str,
) -> TuneSession:
    """Record the session (its plan, approvals and the flags to restore) before any trial;
    refused, naming who holds it, while a change or another session runs on the target."""
    try:
        return await records.begin(
            target=name, requested_by=approval.requested_by,
            approved_by=approval.approved_by, plan=plan.model_dump(mode="json"),
            before=before.to_json(), runner=runner,
            detail={"os_user": _os_user(), "host": socket.gethostname(),
                    "space": search.space.describe(), "budget": search.budget},
        )  # fmt: skip
    except TargetBusy as exc:
        raise UsageError(tuning_refusal(name, exc.holder)) from None


async def finish(
    records: TuneRecords,
    session_id: int,
    actuator: Actuator,
    before: Deployed,
    *,
    runner: str,
    reason: str,
    echo: Echo,
    rolled_back: bool,
    result: dict[str, Any] | None = None,
) -> None:
    """Put ``before`` back unless it is known to serve (``rolled_back``: the last trial's
    rollback worked; then it must still answer a completion), and write the end: restored, or
    failed (with the audit action the bot's rollback-failed alert counts) and RestoreFailed."""
    try:
        moved = await records.step(
            session_id, action="tune.restoring", detail={"reason": reason},
            owner=runner, state="restoring",
        )  # fmt: skip
    except Exception:  # the store does not answer: the target goes back all the same
        if not rolled_back:
            await restore_target(actuator, before)
        raise
    if not moved:
        raise LostRun(f"tuning session {session_id} is no longer run by {runner}")
    try:
        serving = await _current(actuator) if rolled_back else None
        if serving is None or serving.flags != before.flags:
            echo(f"tuning session #{session_id}: restoring {flags_text(before.flags)}…")
            serving = await restore_target(actuator, before)
        else:
            await verify_serving(serving.base_url)
    except Exception as exc:
        error = str(exc) if isinstance(exc, RuleloopError) else f"unexpected {type(exc).__name__}"
        log.error("restore of tuning session %s failed", session_id, exc_info=exc)
        await records.step(
            session_id, action=ROLLBACK_FAILED,
            detail={"error": error, "reason": reason}, owner=runner, state="failed",
            result={**(result or {}), "error": error},
        )  # fmt: skip
        raise exc if isinstance(exc, RestoreFailed) else RestoreFailed(error) from exc
    await records.step(
        session_id, action="tune.restored",
        detail={"reason": reason, "flags": serving.flags}, owner=runner, state="restored",
        trial={}, result={**(result or {}), "reason": reason},
    )  # fmt: skip
    echo(f"tuning session #{session_id}: {flags_text(serving.flags)} serve again ({reason})")


async def _current(actuator: Actuator) -> Deployed | None:
    try:
        return await actuator.current()
    except ActuatorError:
        return None  # nothing serves (an engine that did not come back): restore it


def _why(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt | asyncio.CancelledError):
        return "interrupted"
    return str(exc) or type(exc).__name__


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


# --- restoring a session whose process died -------------------------------------------------


def runner_is_dead(runner: str | None) -> bool:
    """Whether ``runner`` (host:pid:random) was a process on this host that no longer runs."""
    if not runner:
        return False
    host, _, rest = runner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    return not process_alive(int(pid_text))


async def restore_session(
    records: TuneRecords,
    row: TuneSession,
    actuator: Actuator,
    *,
    stale_s: float | None,
    echo: Echo,
) -> bool:
    """Take over ``row`` (silent ``stale_s``, or its runner known dead when None) and put its
    ``before`` back; False when another process took it or its run beat again meanwhile."""
    runner = replica_id()
    won = await records.take_over(row.id, runner=runner, stale_s=stale_s, was_run_by=row.runner)
    if not won:
        return False
    trial = row.trial or {}
    where = f"trial {trial.get('number')} ({trial.get('phase')})" if trial else "between trials"
    echo(f"tuning session #{row.id} on {row.target} stopped during {where}: restoring it")
    # what the dead process left is unknown (a canary stage may run a trial's flags while the
    # main Deployment reads as before): always roll back to the record
    await finish(
        records, row.id, actuator, Deployed.from_json(row.before), runner=runner, echo=echo,
        reason=f"its process stopped during {where}", result=dict(row.result or {}),
        rolled_back=False,
    )  # fmt: skip
    return True


@dataclass(frozen=True)
class SessionRestorer:
    """The restorer of tuning sessions and drift before-runs for the one resume path
    (bot.change.resume): a silent one's target gets back the flags it found."""

    settings: Settings
    records: TuneRecords
    actuator_for: ActuatorFactory
    echo: Echo = lambda line: None

    async def take_over(self, change: Change, *, stale_s: float) -> bool:
        """Restore ``change`` (a TuneSession) if still silent; True when this process did. A
        failed restore is logged, marked failed and counted by the rollback-failed alert."""
        assert isinstance(change, TuneSession), change.kind
        try:
            name, spec = self.settings.target(change.target)
            async with opened(self.actuator_for, name, spec) as actuator:
                return await restore_session(
                    self.records, change, actuator, stale_s=stale_s, echo=self.echo
                )
        except (RuleloopError, LostRun) as exc:
            log.error("tuning session %s on %s: restore failed: %s", change.id, change.target, exc)
            return False


async def restore_target_session(
    settings: Settings,
    records: TuneRecords,
    target: str,
    *,
    actuator_for: ActuatorFactory,
    echo: Echo,
    wait_s: float | None = None,
) -> TuneSession:
    """`ruleloop tune --target NAME --restore`: finish the restore of the session in flight on
    ``target`` once it is silent (at once when its process is known dead on this host)."""
    name, spec = settings.target(target)
    stale_s = settings.remediation.stale_after_s
    wait_s = stale_s + 2 * settings.remediation.heartbeat_s if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    while True:
        row = await records.latest(name)
        if row is None or row.state not in ("running", "restoring"):
            ended = f" (the last one, #{row.id}, is {row.state})" if row is not None else ""
            raise UsageError(f"no tuning session is in flight on {name}{ended}: nothing to restore")
        dead = runner_is_dead(row.runner)
        async with opened(actuator_for, name, spec) as actuator:
            restored = await restore_session(
                records, row, actuator, stale_s=None if dead else stale_s, echo=echo
            )
        if restored:
            return await records.get(row.id)
        if time.monotonic() > deadline:
            raise UsageError(
                f"tuning session #{row.id} on {name} is still alive (run by {row.runner}, "
                f"heartbeats within {stale_s:g} s): let it finish, or stop its process (it "
                "restores the target itself on Ctrl-C); nothing was changed"
            )
        echo(f"tuning session #{row.id} looks alive (run by {row.runner}); waiting until it "
             f"has been silent {stale_s:g} s…")  # fmt: skip
        await asyncio.sleep(max(0.5, settings.remediation.heartbeat_s))


# --- the workload a session replays ----------------------------------------------------------


async def capture_shape(spec: Target, *, seconds: float, echo: Echo) -> WorkloadShape:
    """The target's own traffic over the next ``seconds``, from every replica's /metrics, as
    one replica's share (the tuning replays it on one engine)."""
    from bot.adr.workload import per_replica
    from bot.diagnosis.probes import (
        CAPTURE_METRICS,
        CaptureProgress,
        Exposition,
        MetricsScraper,
        Replica,
        capture_fleet,
        resolve_replicas,
    )

    def progress(p: CaptureProgress) -> None:
        echo(f"capturing the target's workload: {p.elapsed_s:.0f}/{p.seconds:.0f} s, "
             f"{p.finished} requests finished")  # fmt: skip

    async with httpx.AsyncClient(timeout=10.0) as client:
        replicas = await resolve_replicas(spec)
        scrapers = {r: MetricsScraper(r.metrics_url, client=client) for r in replicas}

        async def scrape(replica: Replica) -> Exposition:
            return await scrapers[replica](only=CAPTURE_METRICS)

        fleet = await capture_fleet(
            list(scrapers),
            scrape,
            seconds=seconds,
            interval_s=min(5.0, max(0.5, seconds / 10)),
            on_progress=progress,
        )
    if fleet.arrivals.replicas > 1:
        echo(f"captured {fleet.source}: replayed as one replica's share")
    return per_replica(fleet)


def utc_now() -> dt.datetime:
    """The records' clock."""
    return dt.datetime.now(dt.UTC)
