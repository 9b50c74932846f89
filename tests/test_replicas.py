"""Two real `ruleloop serve` replicas sharing one real PostgreSQL (Debian's), the fake Slack and a
recorded-/metrics engine: a scheduled job runs once per period across both, the same webhook
delivered to both makes one incident, the same click delivered to both acts once, a replica
killed mid-job loses no period and repeats none, an ADR accepted through one is listed and
matched by the other at once, and of two reviewers deciding one draft at once one wins. No vLLM
engine: snapshots and diagnoses read recorded /metrics pages over real HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from bot.engine.process import free_port
from bot.kernel.store.db import Database
from bot.kernel.store.models import AdrRevision, JobRun, MetricSnapshot
from bot.surfaces.slack.views import NO_MATCH
from tests import store_reads
from tests.fakes.alerts import alert, body
from tests.fakes.bot import AM_TOKEN, PAGES, RUNBOOK
from tests.fakes.metrics_server import RecordedMetrics
from tests.fakes.slack_api import BOT_TOKEN, SIGNING_SECRET, FakeSlack, signed_headers
from tests.test_bot_e2e import Process
from tests.test_bot_store import new_database, postgres  # noqa: F401  (the real PostgreSQL server fixture)

pytestmark = pytest.mark.slow
SNAPSHOT = "snapshot:tiny"


class Replicas:
    """N `ruleloop serve` processes on one PostgreSQL database."""

    def __init__(self, tmp_path: Path, *, url: str, slack: FakeSlack, engine: str,
                 scheduler: dict[str, Any], count: int = 2, extra: str = "") -> None:  # fmt: skip
        runbooks = tmp_path / "runbooks"
        runbooks.mkdir()
        (runbooks / "test.yaml").write_text(RUNBOOK)
        config = tmp_path / "ruleloop.toml"
        lines = [
            '[slack]\nchannel = "#incidents"',
            f'[paths]\nrunbooks = "{runbooks}"\nadr = "{Path(__file__).parent.parent / "adr"}"',
            f'[targets.tiny]\nvllm_url = "{engine}"',
            "[scheduler]",
            *(f"{key} = {value}" for key, value in scheduler.items()),
            extra,
        ]
        config.write_text("\n".join(lines) + "\n")
        env = {**os.environ, "RULELOOP_CONFIG": str(config), "RULELOOP_DATABASE_URL": url,
               "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_SIGNING_SECRET": SIGNING_SECRET,
               "SLACK_API_URL": slack.api_url, "RULELOOP_ALERTMANAGER_TOKEN": AM_TOKEN}  # fmt: skip
        env.pop("SLACK_APP_TOKEN", None)
        self.ports = [free_port() for _ in range(count)]
        self.procs = [
            Process(
                [
                    sys.executable,
                    "-c",
                    "from bot.app.cli import main; main()",
                    "serve",
                    "--port",
                    str(port),
                    "--state-dir",
                    str(tmp_path / f"state-{n}"),
                ],
                log=tmp_path / f"serve-{n}.log",
                env=env,
            )  # fmt: skip
            for n, port in enumerate(self.ports)
        ]
        for proc, port in zip(self.procs, self.ports, strict=True):
            proc.wait_ready(f"http://127.0.0.1:{port}/healthz", timeout=120)

    def url(self, n: int, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[n]}{path}"

    def owner_pid(self, owner: str) -> int:
        """The pid in a job_runs owner (host:pid:random)."""
        return int(owner.split(":")[1])

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()


@pytest.fixture
def pg_url(postgres: str) -> Iterator[str]:  # noqa: F811
    """A new, empty database on the PostgreSQL server (the replicas migrate it at start)."""
    yield new_database(postgres, prefix="r")


@pytest.fixture
def engine() -> Iterator[RecordedMetrics]:
    with RecordedMetrics(PAGES) as server:
        yield server


@pytest.fixture
def db(pg_url: str) -> Iterator[Database]:
    database = Database(pg_url)
    yield database
    database.dispose()


def wait_for(check: Callable[[], Any], *, timeout: float = 60, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(0.1)


def job_runs(db: Database, job: str = SNAPSHOT) -> list[JobRun]:
    with db.transaction() as s:
        return list(s.scalars(select(JobRun).where(JobRun.job == job).order_by(JobRun.period)))


def snapshot_count(db: Database) -> int:
    with db.transaction() as s:
        return len(s.scalars(select(MetricSnapshot.id)).all())


def assert_each_period_once(runs: list[JobRun], every_s: float, snapshots: int) -> None:
    """Consecutive periods, each finished once, each with exactly one snapshot kept."""
    done = [r for r in runs if r.finished_at is not None]
    assert all(r.state == "done" for r in done), [(r.period, r.state, r.detail) for r in done]
    periods = [r.period.timestamp() for r in done]
    assert len(periods) == len(set(periods))
    steps = {round(b - a, 3) for a, b in zip(periods, periods[1:], strict=False)}
    assert steps <= {every_s}, f"a period was lost: steps {steps}"
    assert snapshots == len(done)


def test_replicas_run_each_scheduled_period_once(
    tmp_path: Path, pg_url: str, db: Database, slack: FakeSlack, engine: RecordedMetrics
) -> None:
    every = 2  # short, yet long enough that a loaded 2-core box does not miss whole periods
    scheduler = {"snapshot_every_s": every, "snapshot_window_s": 0.3, "baseline_every_s": 0,
                 "draft_reminder_every_s": 0, "lease_ttl_s": 3}  # fmt: skip
    replicas = Replicas(tmp_path, url=pg_url, slack=slack, engine=engine.base_url,
                        scheduler=scheduler)  # fmt: skip
    try:
        wait_for(lambda: sum(r.state == "done" for r in job_runs(db)) >= 5, what="5 periods")
    finally:
        replicas.stop()
    runs = job_runs(db)
    assert_each_period_once(runs, every, snapshot_count(db))
    assert all(r.attempts == 1 for r in runs)  # nobody died: no takeover
    assert len({r.owner for r in runs}) in (1, 2)  # whichever replica claimed first
    assert db.revision() is not None  # both migrated the empty database at once


async def test_replicas_same_webhooks_to_both_make_one_incident_per_target(
    tmp_path: Path, pg_url: str, db: Database, slack: FakeSlack, engine: RecordedMetrics
) -> None:
    scheduler = {"enabled": "false"}
    replicas = Replicas(tmp_path, url=pg_url, slack=slack, engine=engine.base_url,
                        scheduler=scheduler)  # fmt: skip
    try:
        headers = {"Authorization": f"Bearer {AM_TOKEN}", "Content-Type": "application/json"}
        groups = [
            body(alert(fingerprint=f"{n:016x}", ruleloop_target="tiny"),
                 group_key=f'{{}}:{{instance="engine-{n}"}}')
            for n in range(4)
        ]  # fmt: skip
        async with httpx.AsyncClient(timeout=30) as client:
            answers = await asyncio.gather(
                *(client.post(replicas.url(n, "/alertmanager"), content=group, headers=headers)
                  for group in groups for n in (0, 1))
            )  # fmt: skip
        assert all(a.status_code in (200, 202) for a in answers), [a.text for a in answers]
        outcomes = sorted(a.json()["outcome"] for a in answers)
        # one target's 4 groups (one per engine) are one incident: each group's twin on the
        # other replica is a duplicate, the first group opens it and the others join it
        assert outcomes == ["duplicate"] * 4 + ["opened"] + ["updated"] * 3, outcomes
        await slack.until("chat.update", 1, timeout=60)  # the incident diagnosed once
        await asyncio.sleep(1)  # anything posted twice would have arrived by now
    finally:
        replicas.stop()
    with db.transaction() as s:
        incidents = store_reads.incidents(s)
        alerts = [len(i.alerts) for i in incidents]
        opened = [e for e in store_reads.audit_trail(s) if e.action == "incident.opened"]
    assert alerts == [4] and len(opened) == 1
    roots = [c for c in slack.of("chat.postMessage") if not c.args.get("thread_ts")]
    assert len(roots) == 1 and len(slack.of("chat.update")) == 1


def test_replicas_killed_mid_job_loses_no_period_and_repeats_none(
    tmp_path: Path, pg_url: str, db: Database, slack: FakeSlack, engine: RecordedMetrics
) -> None:
    every = 3  # the survivor's next tick does the dead one's period and its own in 2.4 s
    scheduler = {"snapshot_every_s": every, "snapshot_window_s": 1.2, "baseline_every_s": 0,
                 "draft_reminder_every_s": 0, "lease_ttl_s": 1}  # fmt: skip
    replicas = Replicas(tmp_path, url=pg_url, slack=slack, engine=engine.base_url,
                        scheduler=scheduler)  # fmt: skip
    try:
        # wait for a period some replica is in the middle of, and kill that replica (-9)
        running = wait_for(
            lambda: next((r for r in job_runs(db) if r.finished_at is None), None),
            what="a running period",
        )
        victim = next(p for p in replicas.procs if p.proc.pid == replicas.owner_pid(running.owner))
        victim.proc.kill()
        victim.proc.wait()
        survivor_pid = next(p.proc.pid for p in replicas.procs if p is not victim)

        def taken_over() -> JobRun | None:
            row = next(r for r in job_runs(db) if r.period == running.period)
            return row if row.finished_at is not None else None

        finished = wait_for(taken_over, timeout=30, what="the takeover")
        assert finished.state == "done" and finished.attempts == 2
        assert replicas.owner_pid(finished.owner) == survivor_pid

        def later_periods_done() -> bool:
            later = [r for r in job_runs(db) if r.period > finished.period]
            return sum(r.finished_at is not None for r in later) >= 2

        wait_for(later_periods_done, timeout=30, what="two later periods")
    finally:
        replicas.stop()
    runs = job_runs(db)
    assert_each_period_once(runs, every, snapshot_count(db))
    assert [r.period for r in runs if r.attempts > 1] == [running.period]


async def test_replicas_a_click_delivered_to_both_acts_once(
    tmp_path: Path, pg_url: str, db: Database, slack: FakeSlack, engine: RecordedMetrics
) -> None:
    access = '[access]\napply = ["U1"]\napprove = ["U1", "U2"]\n[targets.tiny.actuator]\nkind = "dry-run"\n'
    replicas = Replicas(tmp_path, url=pg_url, slack=slack, engine=engine.base_url,
                        scheduler={"enabled": "false"}, extra=access)  # fmt: skip
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            form = {"command": "/apply-adr", "text": "ADR-20260831-01 tiny", "user_id": "U1",
                    "channel_id": "C0INCIDENTS", "team_id": "T0FAKE", "trigger_id": "1.2.3",
                    "response_url": slack.response_url("cmd"), "token": "legacy"}  # fmt: skip
            request = urllib.parse.urlencode(form).encode()
            asked = await client.post(replicas.url(0, "/slack/events"), content=request,
                                      headers=signed_headers(request))  # fmt: skip
            assert asked.status_code == 200, asked.text
            card = (await slack.until("chat.postMessage", 2, timeout=30))[-1]
            approve = next(e["value"] for b in card.args["blocks"] if b["type"] == "actions"
                           for e in b["elements"] if e["action_id"] == "remediation_approve")  # fmt: skip
            payload = {"type": "block_actions", "user": {"id": "U2"}, "team": {"id": "T0FAKE"},
                       "api_app_id": "A0", "trigger_id": "1.2.3",
                       "response_url": slack.response_url("btn"), "channel": {"id": "C0INCIDENTS"},
                       "container": {"type": "message"},
                       "actions": [{"type": "button", "action_id": "remediation_approve",
                                    "block_id": "b", "value": approve, "action_ts": "1"}]}  # fmt: skip
            click = urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()
            headers = signed_headers(click)  # the very same signed request, to both replicas
            answers = await asyncio.gather(
                *(client.post(replicas.url(n, "/slack/events"), content=click, headers=headers)
                  for n in (0, 1))
            )  # fmt: skip
            # the replay guard is in the store: the copy is refused by whichever replica is second
            assert sorted(a.status_code for a in answers) == [200, 401]

        def approvals() -> list[str]:
            with db.transaction() as s:
                return [
                    e.action
                    for e in store_reads.audit_trail(s)
                    if e.action.startswith("remediation.")
                ]

        wait_for(lambda: "remediation.approved" in approvals(), timeout=30, what="the approval")
        await asyncio.sleep(1)  # a second approval would have been written by now
    finally:
        replicas.stop()
    assert approvals().count("remediation.approved") == 1
    # the copy never reached the other replica's app: nobody answered "someone was first"
    assert [c for c in slack.of("response_url") if c.args.get("name") == "btn"] == []


# --- ADRs in the store: decided through one replica, used by the other at once ---------------
REVIEWERS = '[access]\ndiagnose = ["U1"]\napply = ["U1"]\nreview = ["U2", "U3"]\n'


async def slash(client: httpx.AsyncClient, slack: FakeSlack, url: str, command: str,
                text: str, *, user: str = "U1") -> None:  # fmt: skip
    """A signed slash command, as Slack posts it."""
    form = {"command": command, "text": text, "user_id": user, "channel_id": "C0INCIDENTS",
            "team_id": "T0FAKE", "trigger_id": "1.2.3", "token": "legacy",
            "response_url": slack.response_url(f"{command.strip('/')}-{uuid.uuid4().hex[:6]}")}  # fmt: skip
    request = urllib.parse.urlencode(form).encode()
    answer = await client.post(url, content=request, headers=signed_headers(request))
    assert answer.status_code == 200, answer.text


async def press(client: httpx.AsyncClient, slack: FakeSlack, url: str, action_id: str,
                value: str, *, user: str) -> str:  # fmt: skip
    """A signed button click; the name of its response_url (where refusals are answered)."""
    name = f"{action_id}-{user}"
    payload = {"type": "block_actions", "user": {"id": user}, "team": {"id": "T0FAKE"},
               "api_app_id": "A0", "trigger_id": "1.2.3", "response_url": slack.response_url(name),
               "channel": {"id": "C0INCIDENTS"}, "container": {"type": "message"},
               "actions": [{"type": "button", "action_id": action_id, "block_id": "b",
                            "value": value, "action_ts": uuid.uuid4().hex}]}  # fmt: skip
    click = urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()
    answer = await client.post(url, content=click, headers=signed_headers(click))
    assert answer.status_code == 200, answer.text
    return name


def draft_buttons(slack: FakeSlack, count: int) -> tuple[str, dict[str, str]]:
    """The id and Accept / Reject values of the ``count``-th draft posted."""
    drafts = [c for c in slack.of("chat.postMessage")
              if str(c.args.get("text", "")).startswith("Post-incident ADR draft ")]  # fmt: skip
    if len(drafts) < count:
        return "", {}
    card = drafts[count - 1]
    adr_id = str(card.args["text"]).split()[3].rstrip(":")
    values = {e["action_id"]: e["value"] for b in card.args["blocks"] if b["type"] == "actions"
              for e in b["elements"]}  # fmt: skip
    return adr_id, values


def adr_messages(slack: FakeSlack) -> list[str]:
    """The texts of the diagnoses' ADR messages (matching ADRs, or none), oldest first."""
    return [str(c.args["text"]) for c in slack.of("chat.postMessage")
            if str(c.args.get("text", "")).startswith(("Matching accepted ADRs", "No accepted ADR"))]  # fmt: skip


def listed(pg_url: str, *args: str) -> str:
    """`ruleloop adr list` against the store the replicas share."""
    from click.testing import CliRunner

    from bot.app.cli import cli

    env = {"RULELOOP_CONFIG": None, "RULELOOP_DATABASE_URL": pg_url}
    result = CliRunner().invoke(cli, ["adr", "list", *args], env=env)
    assert result.exit_code == 0, result.output
    return result.output


def decided(db: Database) -> list[str]:
    with db.transaction() as s:
        return [e.action for e in store_reads.audit_trail(s)
                if e.action in ("adr_draft.accepted", "adr_draft.rejected")]  # fmt: skip


async def test_replicas_an_adr_accepted_through_one_is_listed_and_matched_by_the_other(
    tmp_path: Path, pg_url: str, db: Database, slack: FakeSlack, engine: RecordedMetrics
) -> None:
    replicas = Replicas(tmp_path, url=pg_url, slack=slack, engine=engine.base_url,
                        scheduler={"enabled": "false"}, extra=REVIEWERS)  # fmt: skip
    events = [replicas.url(n, "/slack/events") for n in (0, 1)]
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            # a diagnosis through replica 0 (no ADR matches it), and its post-incident draft
            await slash(client, slack, events[0], "/diagnose", "tiny")
            wait_for(lambda: len(adr_messages(slack)) == 1, what="the first diagnosis")
            assert adr_messages(slack) == [NO_MATCH]
            await slash(client, slack, events[0], "/adr-draft", "")
            adr_id, buttons = wait_for(lambda: draft_buttons(slack, 1)[0] and draft_buttons(slack, 1),
                                       what="the draft")  # fmt: skip
            assert f"{adr_id}  proposed" in listed(pg_url)
            # accepted through replica 1: replica 0 matches it in its next diagnosis, no restart
            await press(client, slack, events[1], "adr_draft_accept",
                        buttons["adr_draft_accept"], user="U2")  # fmt: skip
            wait_for(lambda: decided(db) == ["adr_draft.accepted"], what="the acceptance")
            assert f"{adr_id}  accepted" in listed(pg_url, "--status", "accepted")
            await slash(client, slack, events[0], "/diagnose", "tiny")
            wait_for(lambda: len(adr_messages(slack)) == 2, what="the second diagnosis")
            assert adr_id in adr_messages(slack)[1].removeprefix("Matching accepted ADRs: ")
    finally:
        replicas.stop()
    # both replicas imported adr/ into the empty store as they started: each file once
    with db.transaction() as s:
        imported = [r.adr_id for r in s.scalars(select(AdrRevision)) if r.source == "file"]
    assert sorted(imported) == sorted({"ADR-20260831-01", "ADR-20261129-01"})


async def test_replicas_two_reviewers_at_once_one_decision_and_the_other_is_told(
    tmp_path: Path, pg_url: str, db: Database, slack: FakeSlack, engine: RecordedMetrics
) -> None:
    replicas = Replicas(tmp_path, url=pg_url, slack=slack, engine=engine.base_url,
                        scheduler={"enabled": "false"}, extra=REVIEWERS)  # fmt: skip
    events = [replicas.url(n, "/slack/events") for n in (0, 1)]
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            await slash(client, slack, events[0], "/diagnose", "tiny")
            wait_for(lambda: adr_messages(slack), what="the diagnosis")
            await slash(client, slack, events[1], "/adr-draft", "")
            adr_id, buttons = wait_for(lambda: draft_buttons(slack, 1)[0] and draft_buttons(slack, 1),
                                       what="the draft")  # fmt: skip
            # U2 accepts through replica 0 as U3 rejects through replica 1
            names = await asyncio.gather(
                press(client, slack, events[0], "adr_draft_accept", buttons["adr_draft_accept"],
                      user="U2"),
                press(client, slack, events[1], "adr_draft_reject", buttons["adr_draft_reject"],
                      user="U3"),
            )  # fmt: skip
            (state,) = wait_for(lambda: decided(db), what="a decision")
            winner, loser = (("U2", names[1]) if state == "adr_draft.accepted"
                             else ("U3", names[0]))  # fmt: skip
            told = wait_for(lambda: [c for c in slack.of("response_url")
                                     if c.args.get("name") == loser], what="the refusal")  # fmt: skip
            await asyncio.sleep(1)  # a second decision would have been written by now
    finally:
        replicas.stop()
    outcome = state.removeprefix("adr_draft.")
    assert decided(db) == [state]  # exactly one decision
    assert str(told[0].args["text"]).startswith(f"{adr_id} was already {outcome} by <@{winner}>")
    assert str(told[0].args["text"]).endswith("Nothing was changed.")
    assert f"{adr_id}  {outcome}" in listed(pg_url)
    with db.transaction() as s:
        versions = [r.version for r in s.scalars(select(AdrRevision)) if r.adr_id == adr_id]
    assert versions == [1, 2]  # drafted, decided once
