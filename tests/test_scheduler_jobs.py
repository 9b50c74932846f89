"""The scheduled jobs in a real bot (create_bot against the fake Slack), driven period by period
on a controlled clock through the scheduler's own runner: baseline drift, draft reminders,
approval expiry, and the snapshots that make "normal"."""

from __future__ import annotations

import datetime as dt
import json
import re
import statistics
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from bot.adr.models import AdrGates
from bot.app.scheduler.runner import Job, RunResult
from bot.canary.verdict import gates_from, judged
from bot.kernel.config import CanarySpec
from bot.kernel.numbers.catalogue import NORMAL_KEYS
from bot.kernel.store import service as store
from bot.kernel.store.models import AdrDraft, Incident, MetricSnapshot, Remediation
from bot.remediation.gate import GateRun
from tests import store_reads
from tests.fakes.bot import PAGES, Harness, harness
from tests.fakes.slack_api import FakeSlack
from tests.test_scheduler_workload_drift import record_workload
from tests.workload_pages import chat

ADR = "ADR-20260831-01"  # gates: TTFT p99 <= 350 ms, TPOT p99 <= 35 ms, goodput >= 95 %


class FakeCanary:
    """The canary gate without an engine: a canary JSON report with the numbers it is told."""

    def __init__(self) -> None:
        self.ttft_p99_ms = 180.0
        self.calls: list[tuple[str, AdrGates]] = []
        self.shapes: list[object] = []

    async def __call__(
        self, base_url: str, spec: CanarySpec, gates: AdrGates, *, shape: object = None,
        **judging: object,
    ) -> GateRun:
        self.calls.append((base_url, gates))
        self.shapes.append(shape)
        report = {"ttft_ms": {"p99": self.ttft_p99_ms}, "tpot_ms": {"p99": 21.5},
                  "goodput_ratio": 0.99, "kv_fragmentation": {"observed": 0.12},
                  "requests": {"total": 32, "failed": 0}}  # fmt: skip
        return judged(report, gates_from(gates))


@pytest.fixture
def canary() -> FakeCanary:
    return FakeCanary()


@pytest.fixture
async def h(tmp_path: Path, slack: FakeSlack, canary: FakeCanary) -> AsyncIterator[Harness]:
    scheduler = {
        "snapshot_every_s": 300,
        "snapshot_window_s": 2,
        "normal_of_last": 3,
        "baseline_every_s": 3600,
        "targets": {"prod-a": {"adrs": [ADR]}},
    }
    harness_ = harness(tmp_path, slack=slack, scheduler=scheduler, bot_options={"gate": canary})
    yield harness_
    await harness_.close()


def job(h: Harness, name: str) -> Job:
    assert h.bot.scheduler is not None
    return next(j for j in h.bot.scheduler.jobs if j.name == name)


async def tick(h: Harness, name: str, *, after_s: float = 0) -> list[RunResult]:
    """Move the wall clock on, then tick one job the way APScheduler would."""
    assert h.bot.scheduler is not None
    h.wall.advance(after_s)
    results = await h.bot.scheduler.runner.tick(job(h, name))
    await h.bot.tasks.drain()
    return results


def incidents(h: Harness) -> list[Incident]:
    with h.bot.db.transaction() as s:
        return list(store_reads.incidents(s))


def actions(h: Harness) -> list[str]:
    with h.bot.db.transaction() as s:
        return [e.action for e in store_reads.audit_trail(s)]


# --- baseline canary ------------------------------------------------------------------------
async def test_baseline_drift_opens_one_incident_with_the_numbers_until_it_recovers(
    h: Harness, slack: FakeSlack, canary: FakeCanary
) -> None:
    (ok,) = await tick(h, "baseline:prod-a")
    assert ok.state == "done" and ok.detail["failures"] == [] and incidents(h) == []
    base_url, gates = canary.calls[0]
    assert base_url == "http://10.0.0.5:8000" and gates.max_ttft_p99_ms == 350.0

    canary.ttft_p99_ms = 412.0  # drift beyond the ADR's gate
    (drift,) = await tick(h, "baseline:prod-a", after_s=3600)
    (incident,) = incidents(h)
    assert drift.detail["opened"] and drift.detail["incident"] == incident.id
    assert (incident.source, incident.status, incident.target) == ("scheduler", "firing", "prod-a")
    assert incident.title == "Baseline drift on prod-a: TTFT p99 412ms > 350ms"
    root = slack.of("chat.postMessage")[0]
    assert root.args["text"] == (  # mrkdwn: Slack shows "&gt;" as ">"
        ":rotating_light: Baseline drift on prod-a: TTFT p99 412ms &gt; 350ms · firing · target prod-a"
    )
    thread = [c.args["text"] for c in slack.of("chat.postMessage")[1:]]
    assert all(c.args["thread_ts"] == root.args.get("ts", c.args["thread_ts"])
               for c in slack.of("chat.postMessage")[1:])  # fmt: skip
    numbers = thread[-1]
    assert numbers.startswith(":straight_ruler: *Baseline canary* on *prod-a*")
    assert ":x: TTFT p99 412ms (gate ≤ 350ms, ADR-20260831-01)" in numbers
    assert ":white_check_mark: TPOT p99 21.5ms (gate ≤ 35ms, ADR-20260831-01)" in numbers
    assert "diagnosis.posted" in actions(h)  # posted like an alert: root, diagnosis, chart
    assert slack.of("chat.update")  # the root re-rendered with the diagnosis

    posted = len(slack.of("chat.postMessage"))
    (again,) = await tick(h, "baseline:prod-a", after_s=3600)  # still drifting: same incident
    assert not again.detail["opened"] and len(incidents(h)) == 1
    assert (
        slack.of("chat.postMessage")[posted]
        .args["text"]
        .startswith(":straight_ruler: Still drifting at 04:00 UTC")
    )

    canary.ttft_p99_ms = 200.0
    (recovered,) = await tick(h, "baseline:prod-a", after_s=3600)
    assert recovered.detail["resolved"] == incident.id
    assert incidents(h)[0].status == "resolved"
    assert (
        ":white_check_mark: Resolved: Baseline drift on prod-a"
        in (slack.of("chat.update")[-1].args["text"])
    )
    assert (
        slack.of("chat.postMessage")[-1]
        .args["text"]
        .startswith(":white_check_mark: The baseline canary on *prod-a* meets the gates again")
    )
    assert [a for a in actions(h) if a.startswith("baseline.")] == [
        "baseline.drift", "baseline.drifting", "baseline.recovered"
    ]  # fmt: skip


async def test_baseline_replays_the_workload_the_adr_in_force_records(
    h: Harness, slack: FakeSlack, canary: FakeCanary
) -> None:
    (plain,) = await tick(h, "baseline:prod-a")
    assert canary.shapes == [None]  # no recorded workload: the target's canary load
    record_workload(Path(h.bot.flows.settings.paths.adr), chat())
    canary.ttft_p99_ms = 412.0
    await tick(h, "baseline:prod-a", after_s=3600)
    assert canary.shapes[-1] == chat()
    numbers = slack.of("chat.postMessage")[-1].args["text"]
    assert f"48 requests replaying the workload {ADR} records" in numbers


async def test_baseline_gates_come_from_the_adr_promoted_on_the_target(
    h: Harness, canary: FakeCanary, tmp_path: Path
) -> None:
    adr_dir = Path(h.bot.flows.settings.paths.adr)
    seed = next(adr_dir.glob(f"{ADR}-*.md"))
    strict = seed.read_text().replace(ADR, "ADR-20261129-01")
    strict = strict.replace("max_ttft_p99_ms: 350.0", "max_ttft_p99_ms: 150.0")
    (adr_dir / "ADR-20261129-01-strict.md").write_text(strict)
    with h.bot.db.transaction() as s:
        incident = store.create(s, key="k", source="slash", title="t", target="prod-a",
                                labels={}, at=h.wall.now())  # fmt: skip
        s.add(Remediation(incident_id=incident.id, adr_id="ADR-20261129-01", target="prod-a",
                          requested_by="U1", state="promoted", approvals_needed=1,
                          created_at=h.wall.now(), updated_at=h.wall.now()))  # fmt: skip
    (result,) = await tick(h, "baseline:prod-a")
    assert result.detail["adrs"] == ["ADR-20261129-01"]  # promoted wins over the listed ADR
    assert canary.calls[-1][1].max_ttft_p99_ms == 150.0
    assert result.detail["failures"] == ["TTFT p99 180ms > 150ms"]


async def test_baseline_without_an_adr_in_force_runs_no_canary(
    tmp_path: Path, slack: FakeSlack, canary: FakeCanary
) -> None:
    h = harness(tmp_path, slack=slack, bot_options={"gate": canary},
                scheduler={"targets": {"prod-a": {"adrs": ["ADR-20990101-01"]}}})  # fmt: skip
    try:
        (result,) = await tick(h, "baseline:prod-a")
        assert result.detail == {"skipped": "no accepted ADR in force here",
                                 "missing": ["ADR-20990101-01"], "attempt": 1}  # fmt: skip
        assert canary.calls == []
    finally:
        await h.close()


async def test_baseline_checks_a_before_gate_against_the_change_that_put_the_adr_in_force(
    h: Harness, canary: FakeCanary
) -> None:
    adr_dir = Path(h.bot.flows.settings.paths.adr)
    seed = next(adr_dir.glob(f"{ADR}-*.md"))
    relative = seed.read_text().replace("max_ttft_p99_ms: 350.0", "max_ttft_p99_ms: 0.5x before")
    seed.write_text(relative)

    # Listed, never applied here: no before-run to multiply, and the detail says which gate.
    (listed,) = await tick(h, "baseline:prod-a")
    assert listed.detail["unresolved"] == [f"{ADR} max_ttft_p99_ms"]
    assert canary.calls[-1][1].max_ttft_p99_ms is None  # the absolute gates still ran
    assert canary.calls[-1][1].max_tpot_p99_ms == 35.0

    # Promoted with a before-run of TTFT p99 400 ms: the fix must keep it at 200 ms or less.
    with h.bot.db.transaction() as s:
        incident = store.create(s, key="k", source="slash", title="t", target="prod-a",
                                labels={}, at=h.wall.now())  # fmt: skip
        s.add(Remediation(incident_id=incident.id, adr_id=ADR, target="prod-a",
                          requested_by="U1", state="promoted", approvals_needed=1,
                          result={"before_numbers": {"ttft_p99_ms": 400.0}},
                          created_at=h.wall.now(), updated_at=h.wall.now()))  # fmt: skip
    canary.ttft_p99_ms = 180.0
    (within,) = await tick(h, "baseline:prod-a", after_s=3600)
    assert within.detail["unresolved"] == [] and within.detail["failures"] == []
    assert canary.calls[-1][1].max_ttft_p99_ms == 200.0

    canary.ttft_p99_ms = 300.0  # the improvement is gone: drift, named with the number
    (drift,) = await tick(h, "baseline:prod-a", after_s=3600)
    assert drift.detail["opened"]
    assert drift.detail["failures"] == ["TTFT p99 300ms > 200ms"]


async def test_baseline_never_checks_a_gate_relative_to_the_engines_normal(
    h: Harness, canary: FakeCanary
) -> None:
    adr_dir = Path(h.bot.flows.settings.paths.adr)
    seed = next(adr_dir.glob(f"{ADR}-*.md"))
    seed.write_text(
        seed.read_text().replace("max_ttft_p99_ms: 350.0", "max_ttft_p99_ms: 2x normal")
    )
    for _ in range(3):
        await tick(h, "snapshot:prod-a", after_s=300)
    with h.bot.db.transaction() as s:
        assert s.scalars(select(MetricSnapshot)).all()  # a normal exists
    (result,) = await tick(h, "baseline:prod-a", after_s=3600)
    # the engine's normal is not the canary's kind of number: left out, named
    assert result.detail["unresolved"] == [f"{ADR} max_ttft_p99_ms"]
    assert canary.calls[-1][1].max_ttft_p99_ms is None


# --- draft reminders ------------------------------------------------------------------------
async def test_draft_reminder_fires_once_after_the_configured_time(
    h: Harness, slack: FakeSlack
) -> None:
    created = h.wall.now()
    with h.bot.db.transaction() as s:
        incident = store.create(s, key="g", source="alertmanager", title="TTFT", target="prod-a",
                                labels={}, at=created)  # fmt: skip
        store.add_message(s, incident, kind="root", channel="C0INCIDENTS", ts="1700000000.000100")
        s.add(AdrDraft(adr_id="ADR-20261129-07", incident_id=incident.id, state="proposed",
                       path="adr/drafts/ADR-20261129-07-chunked-prefill.md", author="U1",
                       created_at=created))  # fmt: skip
        s.add(AdrDraft(adr_id="ADR-20261129-08", incident_id=incident.id, state="accepted",
                       path="adr/ADR-20261129-08-x.md", author="U1", created_at=created))  # fmt: skip
    assert (await tick(h, "draft_reminder", after_s=23 * 3600))[0].detail["reminded"] == []
    (fired,) = await tick(h, "draft_reminder", after_s=3600 + 1)
    assert fired.detail["reminded"] == ["ADR-20261129-07"]
    (reminder,) = slack.of("chat.postMessage")
    assert reminder.args["thread_ts"] == "1700000000.000100"
    assert reminder.args["text"] == (
        ":hourglass: *ADR-20261129-07* has waited 24 h for review "
        "(`adr/drafts/ADR-20261129-07-chunked-prefill.md`). Reviewers: <@U2> — accept or reject "
        "the draft with its buttons in this thread, so the next incident has a rule."
    )
    for _ in range(3):  # later periods: nothing more
        assert (await tick(h, "draft_reminder", after_s=900))[0].detail["reminded"] == []
    assert len(slack.of("chat.postMessage")) == 1
    assert actions(h).count("adr.draft_reminded") == 1
    with h.bot.db.transaction() as s:
        draft = s.scalars(select(AdrDraft).where(AdrDraft.adr_id == "ADR-20261129-07")).one()
        assert draft.reminded_at == created + dt.timedelta(seconds=24 * 3600 + 1)


# --- approval expiry ------------------------------------------------------------------------
async def test_an_expired_approval_can_no_longer_be_used(h: Harness, slack: FakeSlack) -> None:
    response = await h.slash(f"{ADR} prod-a", user="U1", command="/apply-adr")
    assert response.status_code == 200, response.text
    _, card = await slack.until("chat.postMessage", 2)
    approve = next(e["value"] for b in card.args["blocks"] if b["type"] == "actions"
                   for e in b["elements"] if e["action_id"] == "remediation_approve")  # fmt: skip
    assert (await tick(h, "approval_expiry", after_s=60))[0].detail["expired"] == 0
    (swept,) = await tick(h, "approval_expiry", after_s=15 * 60)  # the buttons last 15 minutes
    assert swept.detail["expired"] == 1
    assert slack.of("chat.update")[-1].args["text"] == (
        f"{ADR} on prod-a: expired, nothing was changed"
    )
    await h.click(approve, user="U2", action_id="remediation_approve")
    (_, answer) = await slack.until("response_url", 2)  # where the card is; then the click's
    assert answer.args["text"].startswith("This button expired at")
    await h.bot.tasks.drain()
    with h.bot.db.transaction() as s:
        assert s.scalars(select(Remediation.state)).all() == ["expired"]
    assert "remediation.approved" not in actions(h) and "remediation.applying" not in actions(h)


# --- snapshots and "normal" -----------------------------------------------------------------
async def test_snapshots_are_kept_and_shown_as_normal_next_to_now(
    h: Harness, slack: FakeSlack
) -> None:
    for _ in range(4):
        (result,) = await tick(h, "snapshot:prod-a", after_s=300)
        assert result.state == "done", result.detail
    with h.bot.db.transaction() as s:
        rows = s.scalars(select(MetricSnapshot).order_by(MetricSnapshot.at)).all()
        newest = rows[-3:]  # normal_of_last = 3
        normal = statistics.median(r.numbers["ttft_p99_ms"] for r in newest)
    assert len(rows) == 4 and {r.source for r in rows} == {"vllm_metrics 2s"}
    # every number with a normal, ITL p99 too (the recorded engine pages hold its histogram)
    assert all(set(r.numbers) == set(NORMAL_KEYS) for r in rows), [r.numbers for r in rows]
    await h.slash("prod-a")
    await h.bot.tasks.drain()
    summary: dict[str, Any] = incidents(h)[0].summary.json_dict()
    assert summary["normal"]["ttft_p99_ms"] == pytest.approx(normal)
    shown = json.dumps(slack.of("chat.update")[-1].args["blocks"], ensure_ascii=False)
    assert "*TTFT p99*" in shown and "\\nnormal " in shown
    assert "*normal*: the median of the scheduler's recent snapshots" in shown


async def test_a_cold_engines_window_is_no_snapshot_and_says_why(
    tmp_path: Path, slack: FakeSlack, canary: FakeCanary
) -> None:

    def handler(request: httpx.Request) -> httpx.Response:
        page = PAGES[len(calls) % len(PAGES)]
        count = 3.0 if len(calls) < 3 else 79.0
        calls.append(request.url.path)
        text = re.sub(
            r'(vllm:request_success_total\{[^}]*finished_reason="length"[^}]*\}) [0-9.]+',
            lambda m: f"{m[1]} {count}",
            page,
        )
        return httpx.Response(200, text=text)

    calls: list[str] = []
    scheduler = {"snapshot_every_s": 300, "snapshot_window_s": 2, "normal_of_last": 3}
    h = harness(tmp_path, slack=slack, scheduler=scheduler, transport=httpx.MockTransport(handler),
                bot_options={"gate": canary})  # fmt: skip
    try:
        (cold,) = await tick(h, "snapshot:prod-a", after_s=300)
        assert cold.state == "done"
        assert cold.detail["skipped"] == (
            "prod-a had finished 3 requests before the window: still warming up "
            "(normal is taken once it has finished 10)"
        )
        with h.bot.db.transaction() as s:
            assert s.scalars(select(MetricSnapshot)).all() == []
        (warm,) = await tick(h, "snapshot:prod-a", after_s=300)
        assert "skipped" not in warm.detail
        with h.bot.db.transaction() as s:
            assert len(s.scalars(select(MetricSnapshot)).all()) == 1
    finally:
        await h.close()


async def test_baseline_posts_a_drift_incident_a_dead_replica_opened_but_never_posted(
    h: Harness, slack: FakeSlack, canary: FakeCanary
) -> None:
    from bot.app.scheduler.baseline import drift_key

    with h.bot.db.transaction() as s:  # opened, then the replica was killed before posting
        store.create(s, key=drift_key("prod-a"), source="scheduler", target="prod-a", labels={},
                     title="Baseline drift on prod-a: TTFT p99 412ms > 350ms", at=h.wall.now())  # fmt: skip
    canary.ttft_p99_ms = 412.0
    (result,) = await tick(h, "baseline:prod-a")
    assert not result.detail["opened"] and len(incidents(h)) == 1
    root = slack.of("chat.postMessage")[0]
    assert root.args["text"].startswith(":rotating_light: Baseline drift on prod-a")
    assert slack.of("chat.postMessage")[-1].args["text"].startswith(":straight_ruler: *Baseline")
    assert "diagnosis.posted" in actions(h)
