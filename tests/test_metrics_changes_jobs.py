"""The bot's /metrics after real remediations and scheduled job periods: remediations by outcome,
their canaries' verdicts (per run and per gate), and each job's periods by result and lag.

A real bot (tests/fakes/bot.py: real store, Slack faked at the wire) whose canary gate is the
seam its constructor takes (as in test_hold_for_a_person.py: a real report judged by the real
judge); the numbers are read from GET /metrics as Prometheus would scrape them. Each outcome is
checked against the others staying 0: a held change has not ended, a canary that could not run
is an error and not a miss, a job that raises is a failure and not a success.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bot.adr import AdrGates
from bot.app.scheduler.runner import Job, JobOutcome
from bot.kernel import CanarySpec, EngineError
from bot.kernel.runtime.metrics import CANARY_VERDICTS, REMEDIATION_OUTCOMES
from bot.remediation import GateRun
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import FakeSlack
from tests.fakes.sse_engine import SseEngine
from tests.test_adr_relative_flow import MemoryActuator
from tests.test_hold_for_a_person import HOLD_ADR, eight_requests
from tests.test_standing_guardrails import ADR, SLOW_TTFT_ADR, SlowTtftCanary


async def scrape(h: Harness) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """GET /metrics: each sample by (name, labels)."""
    page = await h.client.get("/metrics")
    assert page.status_code == 200
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(page.text)
        for s in family.samples
    }


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:  # fmt: skip
    return samples[(name, frozenset(labels.items()))]


async def cannot_run(
    base_url: str, spec: CanarySpec, gates: AdrGates, *, shape: object = None, **judging: object
) -> GateRun:
    """A canary whose engine does not answer."""
    raise EngineError("the engine did not answer: connection refused")


def make(tmp_path: Path, slack: FakeSlack, engine: SseEngine, gate: Callable[..., Any],
         adr: str) -> Harness:  # fmt: skip
    spec: dict[str, Any] = {"vllm_url": engine.base_url, "actuator": {"kind": "dry-run"}}
    h = harness(
        tmp_path, slack=slack, transport=httpx.MockTransport(lambda r: httpx.Response(404)),
        bot_options={"gate": gate, "actuator_for": MemoryActuator}, targets={"prod-a": spec},
    )  # fmt: skip
    (tmp_path / "adr" / f"{ADR}-fewer-sequences.md").write_text(adr)
    return h


def hold_adr(limit: float, inconclusive: str) -> str:
    return HOLD_ADR.format(limit=limit, inconclusive=inconclusive)


@pytest.fixture
async def engine() -> AsyncIterator[SseEngine]:
    """What a rollback's check that the engine serves again asks (one short completion)."""
    async with SseEngine() as served:
        yield served


@pytest.mark.parametrize(
    ("gate", "adr", "state", "outcome", "verdict", "gates"),
    [
        (SlowTtftCanary(), SLOW_TTFT_ADR, "promoted", "promoted", "met",
         {("min_goodput_ratio", "met"), ("max_error_rate", "met")}),
        (eight_requests, hold_adr(1, "hold"), "rolled_back", "rolled_back", "missed",
         {("max_ttft_p99_ms", "missed"), ("max_error_rate", "met")}),
        (eight_requests, hold_adr(1000, "rollback"), "rolled_back", "rolled_back",
         "inconclusive", {("max_ttft_p99_ms", "inconclusive"), ("max_error_rate", "met")}),
        (eight_requests, hold_adr(1000, "hold"), "held", None, "inconclusive",
         {("max_ttft_p99_ms", "inconclusive"), ("max_error_rate", "met")}),
        (cannot_run, hold_adr(1000, "hold"), "rolled_back", "rolled_back", "error", set()),
    ],
    ids=["met-promoted", "missed-rolled-back", "inconclusive-rolled-back", "inconclusive-held",
         "canary-error"],
)  # fmt: skip
async def test_a_remediation_is_counted_by_outcome_and_canary_verdict(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine, gate: Callable[..., Any], adr: str,
    state: str, outcome: str | None, verdict: str, gates: set[tuple[str, str]],
) -> None:  # fmt: skip
    h = make(tmp_path, slack, engine, gate, adr)
    try:
        before = await scrape(h)
        await h.bot.remediation.request(user_id="U1", adr_id=ADR, target="prod-a")
        rem = await h.approve_change()
        after = await scrape(h)
    finally:
        await h.close()
    assert rem.state == state, rem.result
    for each in REMEDIATION_OUTCOMES:  # every outcome shown from 0; only this one moved
        assert value(before, "ruleloop_remediations_total", outcome=each) == 0
        ended = value(after, "ruleloop_remediations_total", outcome=each)
        assert ended == (1 if each == outcome else 0), (each, ended)
    for each in CANARY_VERDICTS:
        judged = value(after, "ruleloop_canary_verdicts_total", verdict=each)
        assert judged == (1 if each == verdict else 0), (each, judged)
    per_gate = {
        (dict(labels)["gate"], dict(labels)["verdict"])
        for (name, labels), count in after.items()
        if name == "ruleloop_canary_gate_verdicts_total" and count == 1
    }
    assert per_gate == gates, per_gate


async def test_an_expired_request_is_counted_as_expired(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine
) -> None:
    h = make(tmp_path, slack, engine, eight_requests, hold_adr(1, "hold"))
    try:
        await h.bot.remediation.request(user_id="U1", adr_id=ADR, target="prod-a")
        h.wall.advance(h.bot.remediation.settings.remediation.approval_ttl_s + 1)
        assert await h.bot.remediation.expire_due() == 1
        assert await h.bot.remediation.expire_due() == 0  # counted once
        after = await scrape(h)
    finally:
        await h.close()
    assert value(after, "ruleloop_remediations_total", outcome="expired") == 1
    assert sum(value(after, "ruleloop_canary_verdicts_total", verdict=v)
               for v in CANARY_VERDICTS) == 0  # no canary ran  # fmt: skip


@pytest.fixture
async def bot(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[Harness]:
    h = harness(tmp_path, slack=slack)
    yield h
    await h.close()


async def test_scheduled_job_periods_are_counted_by_result_with_their_lag(bot: Harness) -> None:
    calls: list[dt.datetime] = []

    async def boom(now: dt.datetime) -> JobOutcome:
        calls.append(now)
        raise RuntimeError("boom")

    scheduler = bot.bot.scheduler
    assert scheduler is not None
    scheduler.add(Job("boom", 60, boom))  # a job that raises (before the scheduler starts)
    before = await scrape(bot)
    names = {job.name for job in scheduler.jobs}
    assert {"outbox", "approval_expiry", "snapshot:prod-a", "boom"} <= names
    for name in names:  # every job this replica schedules shows from 0, each result
        for result in ("done", "failed", "lost"):
            assert value(before, "ruleloop_scheduled_job_runs_total",
                         job_name=name, result=result) == 0  # fmt: skip
    bot.wall.advance(7)  # 02:00:07: each period began 7 s ago
    (outbox,) = [job for job in scheduler.jobs if job.name == "outbox"]
    (ran,) = await scheduler.runner.tick(outbox)
    (failed,) = await scheduler.runner.tick(Job("boom", 60, boom))
    assert (ran.state, failed.state, len(calls)) == ("done", "failed", 1)
    after = await scrape(bot)
    runs = "ruleloop_scheduled_job_runs_total"
    assert value(after, runs, job_name="outbox", result="done") == 1
    assert value(after, runs, job_name="outbox", result="failed") == 0
    assert value(after, runs, job_name="boom", result="failed") == 1
    assert value(after, runs, job_name="boom", result="done") == 0  # a raise is no success
    lag = "ruleloop_scheduled_job_lag_seconds"
    for name in ("outbox", "boom"):
        assert value(after, f"{lag}_count", job_name=name) == 1
        assert value(after, f"{lag}_sum", job_name=name) == pytest.approx(7.0)
        assert value(after, f"{lag}_bucket", job_name=name, le="5.0") == 0
        assert value(after, f"{lag}_bucket", job_name=name, le="15.0") == 1
    # the same period again: another tick finds it taken and runs nothing, counts nothing
    assert await scheduler.runner.tick(outbox) == []
    again = await scrape(bot)
    assert value(again, runs, job_name="outbox", result="done") == 1
