"""The causes judged against the rules in force on the target (issue 33 (g), (h), (i)): the
live readings from the recorded engine pages, the rules from a REAL store (SQLite and
PostgreSQL) and ADR files on disk, read by bot/app/scheduler/rules_now.py as the bot wires it."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from bot.adr.models import Adr
from bot.adr.parse import parse
from bot.adr.render import render
from bot.adr.store import AdrStore, file_name
from bot.app.scheduler.rules_now import RulesNow
from bot.diagnosis.causes import (
    CACHED_SHARE,
    ENGINE_TTFT,
    GATEWAY_TTFT,
    CauseVerdict,
    RulesInForce,
    gateway_latency,
    judge,
    prefix_cache_lost,
    workload_drift,
)
from bot.diagnosis.probes.context import TargetRef
from bot.diagnosis.runbooks.builtin import default_registry
from bot.diagnosis.runbooks.loader import load_file
from bot.diagnosis.runbooks.runner import RunbookRunner
from bot.gateway.budget import TokenBudget
from bot.gateway.metrics import GatewayMetrics, RelayOutcome
from bot.kernel.config import Target
from bot.kernel.numbers import Measured
from bot.kernel.store import service as store
from bot.kernel.store.db import Database
from bot.kernel.store.models import Incident, JobRun, Remediation
from tests import test_bot_store
from tests.fakes.nvml import FakeNvml
from tests.fakes.slack_api import FakeSlack
from tests.workload_pages import shape

db, postgres = test_bot_store.db, test_bot_store.postgres

REPO = Path(__file__).parent.parent
SEED = parse((REPO / "adr" / "ADR-20260831-01-kv-cache-paging-throughput.md").read_text())
T0 = dt.datetime(2026, 11, 29, 2, 0, tzinfo=dt.UTC)


def adr(adr_id: str = SEED.id, *, hit_rate: float | None = 0.6, status: str = "accepted") -> Adr:
    """The seed ADR, proven under a workload whose prefix cache hit ``hit_rate`` (None: an ADR
    without a workload shape)."""
    workload = None if hit_rate is None else shape([1000, 2000], [100, 200], hit_rate=hit_rate)
    return SEED.model_copy(update={"id": adr_id, "workload": workload, "status": status})


def gateway_page(*ttft_s: float) -> str:
    """The real gateway's /metrics page after streamed answers with these times to first byte."""
    metrics = GatewayMetrics(TokenBudget())
    for ttft in ttft_s:
        metrics.admitted(100)
        metrics.finished(
            RelayOutcome.OK, prompt_tokens=100, output_tokens=10, ttft_s=ttft, tpot_s=0.01
        )
    return metrics.exposition().decode()


async def on_pages(
    rules: RulesInForce | None, gateway: list[str] | None = None
) -> dict[str, CauseVerdict]:
    """The shipped runbook on the recorded engine pages (its prefix cache served 0 % of the
    prompt tokens; TTFT p99 2.5 s), with a gateway serving ``gateway`` (before, after) if any,
    judged with these rules in force."""
    from tests.test_bot_probes import PAGES, context, serve

    loaded = load_file(REPO / "runbooks" / "vllm-latency.yaml", default_registry())
    routes = {"engine/metrics": PAGES, **({"gw/metrics": gateway} if gateway else {})}
    ctx, _ = context(serve(routes), nvml=FakeNvml.no_driver(), hostname="h")
    url = "http://gw:9000" if gateway else None
    target = TargetRef("prod-a", Target(vllm_url="http://engine:8000", gateway_url=url))
    result = await RunbookRunner(registry=default_registry()).run(loaded, target=target, ctx=ctx)
    assert result.readings.value(CACHED_SHARE) == 0.0
    readings = result.readings
    return {v.cause: v for v in judge(loaded.runbook, readings, rules=rules)}


# --- (g) the prefix cache lost --------------------------------------------------------------


async def test_a_rule_proven_on_a_warm_prefix_cache_supports_the_cache_lost() -> None:
    lost = (await on_pages(RulesInForce((adr(hit_rate=0.6),))))["prefix_cache_lost"]
    assert lost.verdict == "supported"
    assert lost.number == f"0.0 % of prompt tokens cached, 60.0 % when {SEED.id} was proven"
    assert (
        lost.evidence == f"the prefix cache served 0.0 % of prompt tokens, 60.0 % under {SEED.id}"
    )


async def test_a_rule_that_did_not_lean_on_the_cache_rules_it_out() -> None:
    lost = (await on_pages(RulesInForce((adr(hit_rate=0.1),))))["prefix_cache_lost"]
    assert lost.verdict == "ruled_out"


@pytest.mark.parametrize(
    ("live", "verdict"),
    [(0.29, "supported"), (0.5, "ruled_out"), (0.6, "ruled_out"), (0.4, "cannot_tell")],
)
def test_the_live_share_against_the_proven_one(live: float, verdict: str) -> None:
    lost = prefix_cache_lost(RulesInForce((adr(hit_rate=0.6),)), Measured.of({CACHED_SHARE: live}))
    assert lost.verdict == verdict  # under half of 60 %: lost; 80 % of it or more: close


async def test_without_a_rule_that_records_its_hit_rate_it_cannot_tell_and_says_why() -> None:
    no_shape = (await on_pages(RulesInForce((adr(hit_rate=None),))))["prefix_cache_lost"]
    assert no_shape.verdict == "cannot_tell"
    assert "records the prefix-cache hit rate" in no_shape.evidence
    nothing = (await on_pages(RulesInForce(())))["prefix_cache_lost"]
    assert nothing.verdict == "cannot_tell"
    unread = (await on_pages(None))["prefix_cache_lost"]  # no store: not judged, as before
    assert unread.verdict == "cannot_tell" and unread.evidence.startswith("not judged")
    unmeasured = prefix_cache_lost(RulesInForce((adr(),)), Measured.of({CACHED_SHARE: None}))
    assert unmeasured.verdict == "cannot_tell" and unmeasured.missing == (CACHED_SHARE,)


# --- (h) the gateway adds the latency ----------------------------------------------------------


async def test_a_gateway_slower_than_its_engine_supports_gateway_latency() -> None:
    # 20 answers began 8-10 s after they arrived at the gateway; the engine's p99 is 2.5 s
    found = await on_pages(None, [gateway_page(), gateway_page(*[8.0] * 20)])
    gateway = found["gateway_latency"]
    assert gateway.verdict == "supported"
    assert gateway.number == "TTFT p99 9,975 ms at the gateway, 2,472 ms at the engine"
    assert gateway.evidence.startswith("the gateway adds 7,503 ms to the engine's TTFT p99")


async def test_a_gateway_close_to_its_engine_rules_it_out() -> None:
    found = await on_pages(None, [gateway_page(), gateway_page(*[2.5] * 20)])
    assert found["gateway_latency"].verdict == "ruled_out"  # 2,990 ms against 2,472 ms


@pytest.mark.parametrize(
    ("gateway_ms", "engine_ms", "verdict"),
    [(400.0, 150.0, "supported"), (180.0, 50.0, "supported"), (150.0, 90.0, "ruled_out"),
     (1000.0, 850.0, "ruled_out"), (1000.0, 600.0, "cannot_tell")],
)  # fmt: skip
def test_what_the_gateway_adds(gateway_ms: float, engine_ms: float, verdict: str) -> None:
    judged = gateway_latency(Measured.of({GATEWAY_TTFT: gateway_ms, ENGINE_TTFT: engine_ms}))
    assert judged.verdict == verdict  # more than half and 100 ms: added; under a fifth or 100 ms


async def test_without_a_gateway_reading_it_cannot_tell_and_is_no_data_gap() -> None:
    none = (await on_pages(None))["gateway_latency"]
    assert none.verdict == "cannot_tell" and none.missing == ()
    assert none.evidence.startswith("no gateway TTFT")
    beyond = await on_pages(None, [gateway_page(), gateway_page(*[100.0] * 20)])
    assert beyond["gateway_latency"].verdict == "cannot_tell"  # all past 80 s: only a bound
    assert "only a bound" in beyond["gateway_latency"].evidence
    loaded = load_file(REPO / "runbooks" / "vllm-latency.yaml", default_registry())
    no_probe = {v.cause: v for v in judge(loaded.runbook, Measured.of({}))}["gateway_latency"]
    assert no_probe.evidence.startswith("not judged: the runbook has no queue_cancel probe")


# --- the rules in force, read from the store as the bot does -----------------------------------


def write(root: Path, *adrs: Adr) -> AdrStore:
    root.mkdir(exist_ok=True)
    for one in adrs:
        (root / file_name(one)).write_text(render(one), encoding="utf-8")
    return AdrStore(root=root)


def promote(db: Database, adr_id: str, *, target: str = "prod-a") -> None:
    with db.transaction() as s:
        made = store.create(s, key=f"k-{adr_id}", source="alertmanager", title="TTFT",
                            target=target, labels={}, at=T0)  # fmt: skip
        s.flush()
        s.add(Remediation(incident_id=made.id, adr_id=adr_id, target=target, requested_by="U1",
                          state="promoted", approvals_needed=1, approved_by=["U2"],
                          created_at=T0, updated_at=T0))  # fmt: skip


async def test_the_rules_in_force_are_the_promoted_change_else_the_listed_ones(
    db: Database, tmp_path: Path
) -> None:
    listed, promoted = adr("ADR-20261101-01", hit_rate=0.6), adr("ADR-20261102-01", hit_rate=0.1)
    draft = adr("ADR-20261103-01", status="proposed")
    adrs = write(tmp_path / "adr", listed, promoted, draft)
    rules = RulesNow(db=db, adrs=adrs, listed={"prod-a": [listed.id, draft.id]})
    assert [a.id for a in (await rules.read("prod-a")).adrs] == [listed.id]  # not the draft
    assert (await rules.read("prod-b")).adrs == ()
    promote(db, promoted.id)
    now = await rules.read("prod-a")
    assert [a.id for a in now.adrs] == [promoted.id]  # what the target runs now
    verdict = prefix_cache_lost(now, Measured.of({CACHED_SHARE: 0.0}))
    assert verdict.verdict == "ruled_out"  # the promoted rule was proven at 10 %


# --- (i) workload drift: the drift job's latest check of the rules in force -----------------

MOVED = "prompt p50: 1,000–2,000 -> 5,000–10,000 tokens (more than 2x larger): DRIFTED"


def drift_run(
    db: Database, at: dt.datetime, detail: dict[str, object], target: str = "prod-a"
) -> None:
    """One period of the scheduler's workload job on ``target``, as its runner keeps it."""
    with db.transaction() as s:
        s.add(JobRun(job=f"workload:{target}", period=at, owner="r1", state="done",
                     claimed_at=at, expires_at=at, finished_at=at, detail=detail))  # fmt: skip


async def test_a_rule_in_force_whose_workload_drifted_supports_workload_drift(
    db: Database, tmp_path: Path
) -> None:
    rule = adr("ADR-20261101-01")
    rules = RulesNow(db=db, adrs=write(tmp_path / "adr", rule), listed={"prod-a": [rule.id]})
    drift_run(db, T0, {"adrs": [rule.id], "drifted": [], "dimensions": {rule.id: []}})
    drift_run(db, T0 + dt.timedelta(hours=1),
              {"adrs": [rule.id], "drifted": [rule.id], "dimensions": {rule.id: [MOVED]}})  # fmt: skip
    drift_run(db, T0 + dt.timedelta(hours=2), {"skipped": "no live shape this period"})
    drift_run(db, T0 + dt.timedelta(hours=3), {"adrs": ["ADR-X"], "drifted": ["ADR-X"]}, "prod-b")
    verdict = workload_drift(await rules.read("prod-a"))
    assert verdict.verdict == "supported" and verdict.number == MOVED
    assert verdict.evidence == (
        f"the drift job found the workload moved from {rule.id}'s on 29 Nov 03:00 UTC: {MOVED}"
    )
    found = await on_pages(await rules.read("prod-a"))  # in the diagnosis's verdicts too
    assert found["workload_drift"].verdict == "supported"


async def test_a_workload_alike_at_the_last_check_rules_drift_out(
    db: Database, tmp_path: Path
) -> None:
    rule = adr("ADR-20261101-01")
    rules = RulesNow(db=db, adrs=write(tmp_path / "adr", rule), listed={"prod-a": [rule.id]})
    drift_run(db, T0, {"adrs": [rule.id], "drifted": [rule.id], "dimensions": {rule.id: [MOVED]}})
    drift_run(db, T0 + dt.timedelta(hours=1),
              {"adrs": [rule.id], "drifted": [], "dimensions": {rule.id: []}})  # fmt: skip
    verdict = workload_drift(await rules.read("prod-a"))
    assert verdict.verdict == "ruled_out" and verdict.number == "alike on 29 Nov 03:00 UTC"


async def test_drift_cannot_tell_without_a_check_or_a_rule_in_force(
    db: Database, tmp_path: Path
) -> None:
    rule, other = adr("ADR-20261101-01"), adr("ADR-20261102-01")
    store_ = write(tmp_path / "adr", rule, other)
    rules = RulesNow(db=db, adrs=store_, listed={"prod-a": [rule.id]})
    never = workload_drift(await rules.read("prod-a"))
    assert never.verdict == "cannot_tell" and "has not compared" in never.evidence
    none = workload_drift(await rules.read("prod-c"))  # no rule in force there
    assert none.verdict == "cannot_tell" and "no rule in force" in none.evidence
    drift_run(
        db, T0, {"adrs": [other.id], "drifted": [other.id], "dimensions": {other.id: [MOVED]}}
    )
    stale = workload_drift(await rules.read("prod-a"))  # it checked another rule then
    assert stale.verdict == "cannot_tell" and "did not compare the rules in force" in stale.evidence
    unread = (await on_pages(None))["workload_drift"]
    assert unread.verdict == "cannot_tell" and unread.evidence.startswith("not judged")


# --- through the real bot (create_bot wires the reader into the diagnosis) ---------------------


async def test_the_served_bot_judges_drift_against_the_change_it_kept(
    tmp_path: Path, slack: FakeSlack
) -> None:
    from tests.test_cause_feedback_thread import SEED as KEPT
    from tests.test_cause_feedback_thread import bot, incident

    h = await bot(tmp_path, slack, "vllm_metrics.ttft_p99_ms > 1")
    try:
        await incident(h, 1)
        now = h.wall.now()
        with h.bot.db.transaction() as s:  # the fix was kept; then the drift job found it moved
            s.add(Remediation(incident_id=1, adr_id=KEPT, target="prod-a", requested_by="U1",
                              state="promoted", approvals_needed=1, approved_by=["U2"],
                              created_at=now, updated_at=now))  # fmt: skip
        drift_run(h.bot.db, now, {"adrs": [KEPT], "drifted": [KEPT], "dimensions": {KEPT: [MOVED]}})
        await incident(h, 2)
    finally:
        await h.close()
    with h.bot.db.transaction() as s:
        first, second = (s.get(Incident, i).summary.json_dict() for i in (1, 2))  # type: ignore[union-attr]
    verdicts = {c["cause"]: c for c in second["causes"]}
    assert verdicts["workload_drift"]["verdict"] == "supported"
    assert verdicts["workload_drift"]["number"] == MOVED
    assert verdicts["prefix_cache_lost"]["verdict"] == "cannot_tell"  # the seed ADR has no shape
    assert "records the prefix-cache hit rate" in verdicts["prefix_cache_lost"]["evidence"]
    before = {c["cause"]: c for c in first["causes"]}  # nothing in force yet
    assert "no rule in force" in before["workload_drift"]["evidence"]
