"""The scheduler's leases and runner on a controlled clock (SQLite and a real PostgreSQL), and its
APScheduler wiring: each period runs once, a dead replica's period is taken over once."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from bot.app.scheduler.runner import Job, JobOutcome, JobRunner
from bot.app.scheduler.scheduler import Scheduler
from bot.kernel.errors import UsageError
from bot.kernel.store import service as store
from bot.kernel.store.db import Database
from bot.kernel.store.leases import LeaseLost, Leases, period_start
from bot.kernel.store.models import JobRun, MetricSnapshot
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import FakeSlack
from tests.test_bot_store import db, postgres  # noqa: F401  (store fixtures: SQLite and PostgreSQL)

T0 = dt.datetime(2026, 11, 29, 2, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    """T0 plus some seconds."""
    return T0 + dt.timedelta(seconds=seconds)


def runs(database: Database) -> list[JobRun]:
    with database.transaction() as s:
        return list(s.scalars(select(JobRun).order_by(JobRun.period)).all())


class Counter:
    """A job function that counts its calls and keeps a snapshot row with each period."""

    def __init__(self, *, fail: bool = False) -> None:
        self.calls: list[dt.datetime] = []
        self.fail = fail

    async def __call__(self, now: dt.datetime) -> JobOutcome:
        self.calls.append(now)
        if self.fail:
            raise RuntimeError("boom")

        def write(session: Any) -> None:
            store.add_snapshot(session, target="t", at=now, source="test", numbers={})

        return JobOutcome({"n": len(self.calls)}, write=write)


@pytest.mark.parametrize(
    ("now", "every_s", "start"),
    [
        (at(0), 300, at(0)),
        (at(299.999), 300, at(0)),
        (at(300), 300, at(300)),
        (at(7), 2, at(6)),
        (at(3601), 3600, at(3600)),
        (at(0.25), 0.5, at(0)),
        (at(0.75), 0.5, at(0.5)),
    ],
)
def test_period_start_is_aligned_to_the_epoch(
    now: dt.datetime, every_s: float, start: dt.datetime
) -> None:
    assert period_start(now, every_s) == start


def test_leases_one_replica_claims_a_period(db: Database) -> None:  # noqa: F811
    a, b = (Leases(db=db, owner=o, ttl_s=60) for o in ("a", "b"))
    assert a.claim("snapshot:x", at(0), now=at(1)) is not None
    assert b.claim("snapshot:x", at(0), now=at(1)) is None
    assert b.claim("snapshot:x", at(300), now=at(301)) is not None  # the next period
    assert b.claim("baseline:x", at(0), now=at(1)) is not None  # another job
    assert {(r.job, r.owner) for r in runs(db)} == {
        ("snapshot:x", "a"),
        ("snapshot:x", "b"),
        ("baseline:x", "b"),
    }


def test_leases_a_dead_holders_period_is_taken_over_once(db: Database) -> None:  # noqa: F811
    a, b, c = (Leases(db=db, owner=o, ttl_s=60) for o in ("a", "b", "c"))
    held = a.claim("snapshot:x", at(0), now=at(0))
    assert held is not None and a.renew(held, now=at(30))  # alive until 90 s
    assert b.orphans("snapshot:x", now=at(89)) == []
    assert b.take_over("snapshot:x", at(0), now=at(89)) is None
    taken = b.take_over("snapshot:x", at(0), now=at(91))  # a went silent
    assert taken is not None and taken.attempt == 2
    assert c.take_over("snapshot:x", at(0), now=at(91)) is None  # only one replica takes over
    assert not a.renew(held, now=at(92))  # a wakes up: no longer its period
    with pytest.raises(LeaseLost):
        a.finish(held, now=at(92), state="done", detail={},
                 write=lambda s: store.add_snapshot(s, target="t", at=at(92), source="a", numbers={}))  # fmt: skip
    b.finish(taken, now=at(95), state="done", detail={"by": "b"})
    (row,) = runs(db)
    assert (row.owner, row.state, row.attempts, row.detail) == ("b", "done", 2, {"by": "b"})
    with db.transaction() as s:
        assert s.scalars(select(MetricSnapshot)).all() == []  # a's write was dropped
    assert c.orphans("snapshot:x", now=at(10_000)) == []  # finished: never run again
    assert c.claim("snapshot:x", at(0), now=at(10_000)) is None


def test_leases_give_up_after_max_attempts(db: Database) -> None:  # noqa: F811
    leases = [Leases(db=db, owner=f"r{i}", ttl_s=10, max_attempts=2) for i in range(3)]
    assert leases[0].claim("j", at(0), now=at(0)) is not None
    assert leases[1].take_over("j", at(0), now=at(11)) is not None
    assert leases[2].take_over("j", at(0), now=at(22)) is None  # two replicas died on it
    (row,) = runs(db)
    assert row.state == "abandoned" and row.finished_at == at(22)
    assert "2 replicas died" in row.detail["error"]


@pytest.fixture
def sqlite(tmp_path: Path) -> Database:
    database = Database(f"sqlite:///{tmp_path / 'state.db'}")
    database.create_schema()
    return database


def runner(database: Database, owner: str, clock: list[dt.datetime]) -> JobRunner:
    """A replica's runner whose wall clock is ``clock[0]``."""
    return JobRunner(leases=Leases(db=database, owner=owner, ttl_s=60), clock=lambda: clock[0])


async def test_runner_runs_a_job_once_per_period(sqlite: Database) -> None:
    clock = [at(1)]
    work = Counter()
    job = Job("snapshot:x", 300, work)
    a, b = runner(sqlite, "a", clock), runner(sqlite, "b", clock)
    (result,) = await a.tick(job)
    assert (result.state, result.period, result.detail) == ("done", at(0), {"n": 1, "attempt": 1})
    assert await b.tick(job, now=at(2)) == [] and await a.tick(job, now=at(299)) == []
    clock[0] = at(301)
    assert [r.period for r in await b.tick(job)] == [at(300)]
    assert work.calls == [at(1), at(301)]
    with sqlite.transaction() as s:
        assert len(s.scalars(select(MetricSnapshot)).all()) == 2  # one per period


async def test_runner_a_failed_job_ends_its_period_and_the_next_one_runs(
    sqlite: Database, caplog: pytest.LogCaptureFixture
) -> None:
    clock = [at(1)]
    work = Counter(fail=True)
    job = Job("snapshot:x", 300, work)
    (failed,) = await runner(sqlite, "a", clock).tick(job)
    assert failed.state == "failed" and "unexpected error (id " in failed.detail["error"]
    assert await runner(sqlite, "b", clock).tick(job, now=at(2)) == []  # not retried twice
    work.fail = False
    assert [r.state for r in await runner(sqlite, "b", clock).tick(job, now=at(300))] == ["done"]
    assert "failed unexpectedly" in caplog.text


async def test_runner_finishes_a_dead_replicas_period_then_its_own(sqlite: Database) -> None:
    clock = [at(1)]
    job = Job("snapshot:x", 300, Counter())
    dead = Leases(db=sqlite, owner="dead", ttl_s=60)
    assert dead.claim("snapshot:x", at(0), now=at(1)) is not None  # then killed mid-job
    survivor = runner(sqlite, "b", clock)
    assert await survivor.tick(job, now=at(30)) == []  # the lease is still fresh
    clock[0] = at(301)
    results = await survivor.tick(job)
    assert [(r.period, r.attempt) for r in results] == [(at(0), 2), (at(300), 1)]
    assert [(r.owner, r.state, r.attempts) for r in runs(sqlite)] == [
        ("b", "done", 2), ("b", "done", 1)
    ]  # fmt: skip


async def test_runner_cancels_a_job_whose_lease_was_taken(sqlite: Database) -> None:
    """A replica that stalled past its lease stops working, and its result is not kept."""
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(now: dt.datetime) -> JobOutcome:
        started.set()
        await release.wait()
        return JobOutcome({"stale": True})

    clock = [at(1)]
    stalled = JobRunner(leases=Leases(db=sqlite, owner="a", ttl_s=0.06), clock=lambda: clock[0])
    task = asyncio.create_task(stalled.tick(Job("j", 300, slow)))
    await started.wait()
    clock[0] = at(2)  # its heartbeat renews on this clock; another replica took over meanwhile
    with sqlite.transaction() as s:
        s.execute(JobRun.__table__.update().values(owner="b"))
    (result,) = await asyncio.wait_for(task, 5)
    assert result.state == "lost" and not release.is_set()
    assert runs(sqlite)[0].finished_at is None  # b will finish it


async def test_scheduler_stop_hands_a_running_period_back(sqlite: Database) -> None:
    started = asyncio.Event()

    async def forever(now: dt.datetime) -> JobOutcome:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("never")

    clock = [dt.datetime.now(dt.UTC)]
    scheduler = Scheduler(
        runner=runner(sqlite, "a", clock), jobs=[Job("j", 0.1, forever)], clock=lambda: clock[0]
    )
    scheduler.start()
    await asyncio.wait_for(started.wait(), 5)  # APScheduler fired it (real time, 0.1 s periods)
    await scheduler.stop()
    (row,) = runs(sqlite)
    assert row.finished_at is None and row.expires_at <= clock[0]  # another replica may take it
    assert Leases(db=sqlite, owner="b", ttl_s=60).take_over("j", row.period, now=clock[0] +
                                                            dt.timedelta(microseconds=1))  # fmt: skip


# --- wiring: create_bot -> APScheduler ------------------------------------------------------
@pytest.fixture
async def wired(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[Harness]:
    scheduler = {
        "snapshot_every_s": 60,
        "baseline_every_s": 0,
        "draft_reminder_every_s": 600,
        "approval_sweep_every_s": 30,
        "targets": {"prod-a": {"baseline_every_s": 900, "adrs": ["ADR-20260831-01"]}},
    }
    h = harness(tmp_path, slack=slack, scheduler=scheduler)
    yield h
    await h.close()


async def test_scheduler_registers_the_configured_jobs_with_their_intervals(
    wired: Harness,
) -> None:
    scheduler = wired.bot.scheduler
    assert scheduler is not None
    aps = scheduler.start()
    try:
        jobs = {j.id: j for j in aps.get_jobs()}
        intervals = {name: j.trigger.interval.total_seconds() for name, j in jobs.items()}
        assert intervals == {
            "snapshot:prod-a": 60, "baseline:prod-a": 900, "draft_reminder": 600,
            "approval_expiry": 30, "outbox": 15, "workload:prod-a": 300,
        }  # fmt: skip
        for name, job in jobs.items():  # every replica fires on the same period boundaries
            assert job.next_run_time.timestamp() % intervals[name] == 0
            assert job.max_instances == 1 and job.coalesce
    finally:
        await scheduler.stop()


@pytest.mark.parametrize(
    ("scheduler", "expected"),
    [
        ({"enabled": False}, None),
        ({}, ["snapshot:prod-a", "baseline:prod-a", "workload:prod-a", "draft_reminder",
              "approval_expiry", "outbox"]),
        ({"snapshot_every_s": 0, "baseline_every_s": 0, "workload_every_s": 0,
          "draft_reminder_every_s": 0, "approval_sweep_every_s": 0, "outbox_every_s": 0}, []),
        ({"targets": {"prod-a": {"snapshot_every_s": 0, "workload_every_s": 0}}},
         ["baseline:prod-a", "draft_reminder", "approval_expiry", "outbox"]),
    ],
)  # fmt: skip
def test_scheduler_jobs_follow_the_settings(
    tmp_path: Path, scheduler: dict[str, Any], expected: list[str] | None
) -> None:
    bot = harness(tmp_path, slack=None, scheduler=scheduler).bot
    try:
        names = None if bot.scheduler is None else [j.name for j in bot.scheduler.jobs]
        assert names == expected
    finally:
        bot.db.dispose()


def test_scheduler_unknown_target_is_refused_at_startup(tmp_path: Path) -> None:
    with pytest.raises(
        UsageError, match=r"\[scheduler.targets\] names unknown targets \['prod-z'\]"
    ):
        harness(tmp_path, slack=None, scheduler={"targets": {"prod-z": {}}})


async def test_normal_of_estimates_keeps_their_span_through_the_store(db: Database) -> None:  # noqa: F811
    """Fragmentation from the gauges is an estimate: normal keeps its span (the medians of the
    snapshots' ends), on both backends, and a number known exactly is not given one."""
    from bot.diagnosis.normal import NormalReader

    for i, (frag, span) in enumerate([(0.10, (0.0, 0.2)), (0.12, (0.0, 0.24)), (0.30, None)]):
        with db.transaction() as s:
            store.add_snapshot(
                s, target="t", at=at(i), source="test",
                numbers={"kv_fragmentation": frag, "tpot_p99_ms": 10.0},
                bounds={"tpot_p99_ms": "<="},
                spans={} if span is None else {"kv_fragmentation": span},
            )  # fmt: skip
    normal = await NormalReader(db=db, last=3).read("t")
    assert normal.numbers["kv_fragmentation"] == pytest.approx(0.12)
    # ends (0, 0.2), (0, 0.24), (0.3, 0.3): medians 0.0 and 0.24; the median 0.12 lies within
    kept = normal.json()
    assert kept["spans"] == {"kv_fragmentation": pytest.approx([0.0, 0.24])}
    assert kept["bounds"] == {"tpot_p99_ms": "<="} and "tpot_p99_ms" not in kept["spans"]
