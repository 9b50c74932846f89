"""`ruleloop tune --target NAME`: a search on a target of the bot's config, and `--restore`.

The session itself is ``bot.tune.on_target``'s; this module gathers what it needs from the
command line's world: the bot's settings (TOML file and environment), the store the bot uses
(so a restarted bot, or `--restore`, finds the session), the workload (given, or the target's
own traffic captured first), SIGTERM turned into the same orderly stop as Ctrl-C, and the
draft written where `ruleloop tune` writes it.

Approval at the command line: the names given to --requested-by and --approved-by are checked
against the bot's access lists and the two-person rule, and recorded with the operating-system
user and host that ran the command. They are a record, not a login: whoever can run this with
the bot's config can reach the target anyway. docs/tune.md says so, and what to do about it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bot.adr import AdrStore
from bot.adr.workload import shape as shapes
from bot.change import actuators, tuning_refusal
from bot.change.actuators import Deployed
from bot.engine import default_state_dir
from bot.kernel import Settings, Target, UsageError
from bot.kernel.runtime import run as run_loop
from bot.kernel.store import Database
from bot.tune import (
    DraftPlace,
    Echo,
    TunePlan,
    TuneRecords,
    TuneResult,
    WorkloadSpec,
    approve,
    capture_shape,
    check_target,
    restore_target_session,
    utc_now,
    write_search_draft,
)
from bot.tune import tune_target as run_session

T = TypeVar("T")


@dataclass(frozen=True)
class TargetRun:
    """A search on a target, beyond its plan: the target, who asked and who approved, how long
    to capture its traffic, the bot's config and store, and where and when the draft goes."""

    target: str
    requested_by: str | None
    approved_by: list[str]
    capture_seconds: float
    config_path: Path | None
    state_dir: Path | None
    store: AdrStore
    day: dt.date
    echo: Echo
    workload_given: bool


def tune_target(plan: TunePlan, run: TargetRun) -> TuneResult:
    """Approve, record, search, restore, draft; see the module docstring."""
    settings = Settings.load(os.environ, path=run.config_path)
    name, spec = settings.target(run.target)
    approval = approve(settings, name, requested_by=run.requested_by, approved_by=run.approved_by)
    check_target(name, spec, plan)
    db = _database(settings, run.state_dir)
    try:
        records = TuneRecords(db=db, clock=utc_now)
        busy = _run(records.in_flight(name))
        if busy is not None:  # before a minute of capture, not after
            raise UsageError(tuning_refusal(name, busy))
        place = DraftPlace.next(run.store, plan, run.day)
        _run(_current(name, spec))  # reachable, before a minute of capture
        if not run.workload_given and plan.workload.shape is None:
            plan = _captured(plan, spec_name=name, settings=settings, seconds=run.capture_seconds,
                             runs_dir=place.runs_dir, echo=run.echo)  # fmt: skip
        session = _run(
            run_session(
                plan,
                settings=settings,
                records=records,
                target=name,
                approval=approval,
                runs_dir=place.runs_dir,
                echo=run.echo,
                actuator_for=actuators.build,
            )  # fmt: skip
        )
    finally:
        db.dispose()
    where = (
        f"on target {name} through its {session.actuator} actuator (the canary stage where it "
        "has one), each trial rolled back before the next and the flags found at the start "
        f"({_flags(session.before.flags)}) restored at the end"
    )
    return write_search_draft(plan, session.result, store=run.store, place=place, day=run.day,
                              where=where)  # fmt: skip


def restore_target(
    target: str, *, config_path: Path | None, state_dir: Path | None, echo: Echo
) -> None:
    """Finish the restore of a session whose process died (waits until it is silent)."""
    settings = Settings.load(os.environ, path=config_path)
    db = _database(settings, state_dir)
    try:
        records = TuneRecords(db=db, clock=utc_now)
        row = _run(
            restore_target_session(
                settings, records, target, actuator_for=actuators.build, echo=echo
            )
        )
    finally:
        db.dispose()
    echo(f"tuning session #{row.id} on {row.target}: {row.state}")


def _database(settings: Settings, state_dir: Path | None) -> Database:
    """The store the bot uses ([store] url, else SQLite under [paths] state or --state-dir)."""
    db = Database(settings.database_url(fallback_dir=state_dir or default_state_dir()))
    db.create_schema()
    return db


def _captured(
    plan: TunePlan,
    *,
    spec_name: str,
    settings: Settings,
    seconds: float,
    runs_dir: Path,
    echo: Echo,
) -> TunePlan:
    """The plan replaying the target's own traffic, captured now (kept beside the runs)."""
    _, spec = settings.target(spec_name)
    echo(f"capturing {spec_name}'s workload from {spec.metrics_url} for {seconds:g} s…")
    shape = _run(capture_shape(spec, seconds=seconds, echo=echo))
    runs_dir.mkdir(parents=True, exist_ok=True)
    path = runs_dir / "workload.yaml"
    shapes.save(shape, path)
    spec_now = plan.workload
    workload = WorkloadSpec(
        shape=path, concurrency=spec_now.concurrency, num_requests=spec_now.num_requests,
        warmup_requests=spec_now.warmup_requests, api=spec_now.api,
    )  # fmt: skip
    return plan.model_copy(update={"workload": workload})


async def _current(name: str, spec: Target) -> Deployed:
    """What serves on the target now (its actuator opened for the look, then closed)."""
    async with actuators.opened(actuators.build, name, spec) as actuator:
        return await actuator.current()


def _run(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work``; SIGTERM stops it as Ctrl-C does (the session restores the target first)."""

    async def main() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            return await work
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    try:
        return run_loop(main())
    except asyncio.CancelledError:
        raise UsageError("stopped by SIGTERM (the target was restored first)") from None


def _flags(flags: dict[str, Any]) -> str:
    return " ".join(f"--{k}={v}" for k, v in sorted(flags.items())) or "no tunable flags"
