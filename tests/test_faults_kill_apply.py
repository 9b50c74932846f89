"""Item 4 of the reliability faults, end to end: `kill -9` of the replica running a change, at each
step of the apply, on real `ruleloop serve` processes sharing one real PostgreSQL.

Replica A takes the request and the approval and runs the change; it is killed with SIGKILL
while the change is in one step (approved and measuring the baseline, applying, canary,
promoting, rolling back after a failed canary). Replica B, alive throughout, finds the change
silent past `stale_after_s` and rolls it back. Every change must end promoted, rolled back or
(killed before anything was applied) interrupted, with the Deployments' args verified against
what they were and an audit trail that is one consistent story. The Kubernetes API is the fake
at the wire (over HTTP), the engine a fake that streams tokens and serves recorded /metrics
pages, so the canary is the real one and passes or fails by the engine's token pace.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from bot.engine.process import free_port
from bot.remediation.argv import read_flags
from bot.remediation.ports import STATES
from bot.store.db import Database
from bot.store.models import AuditEntry, Remediation
from tests import store_reads
from tests.fakes.bot import PAGES, RUNBOOK, adr_dir
from tests.fakes.kube_api import TOKEN, FakeKube
from tests.fakes.kube_server import KubeServer
from tests.fakes.slack_api import BOT_TOKEN, SIGNING_SECRET, FakeSlack, signed_headers
from tests.fakes.sse_engine import SseEngine
from tests.test_bot_e2e import Process
from tests.test_bot_store import postgres  # noqa: F401  (the real PostgreSQL server fixture)
from tests.test_replicas import pg_url  # noqa: F401  (a fresh database on it)

pytestmark = [pytest.mark.slow, pytest.mark.faults]
ADR = "ADR-20260831-01"  # --block-size 32, chunked prefill on, --max-num-batched-tokens 2048
ARGS = ["--model", "/models/llama-3-8b", "--api-key", "sk-secret", "--max-num-batched-tokens",
        "8192"]  # fmt: skip
DEPLOYMENTS = ("vllm", "vllm-canary")
PASSING_PACE_S, FAILING_PACE_S = 0.01, 0.06  # between tokens: TPOT 10 ms passes 35 ms, 60 fails
STALE_S = 6.0  # 12 heartbeats: a loaded machine must not make a live replica look dead


@dataclass
class Replica:
    """One `ruleloop serve` process and where it listens."""

    proc: Process
    url: str


@dataclass
class Cluster:
    """What the replicas share: the store, the fake Kubernetes API, the engine, Slack."""

    tmp_path: Path
    db: Database
    kube: FakeKube
    engine: SseEngine
    slack: FakeSlack
    env: dict[str, str]
    survivor: Replica | None = None
    clicks: int = 0

    def replica(self, name: str) -> Replica:
        """A `ruleloop serve` process, started and ready."""
        port = free_port()
        argv = [sys.executable, "-c", "from bot.cli import main; main()", "serve", "--port",
                str(port), "--state-dir", str(self.tmp_path / f"state-{name}")]  # fmt: skip
        proc = Process(argv, log=self.tmp_path / f"serve-{name}.log", env=self.env)
        url = f"http://127.0.0.1:{port}"
        proc.wait_ready(f"{url}/healthz", timeout=120)
        return Replica(proc, url)

    def remediation(self, remediation_id: int | None = None) -> Remediation | None:
        with self.db.transaction() as s:
            query = select(Remediation).order_by(Remediation.id.desc())
            if remediation_id is not None:
                query = query.where(Remediation.id == remediation_id)
            return s.scalars(query).first()

    def trail(self, remediation_id: int) -> list[AuditEntry]:
        with self.db.transaction() as s:
            return [
                e
                for e in store_reads.audit_trail(s)
                if e.action.startswith("remediation.")
                and e.detail.get("remediation") == remediation_id
            ]

    async def post(self, replica: Replica, body: bytes) -> None:
        import httpx

        self.clicks += 1  # one timestamp per request: the same signed request twice is a replay
        headers = signed_headers(body, timestamp=int(time.time()) - self.clicks)
        async with httpx.AsyncClient(timeout=60) as client:
            answer = await client.post(f"{replica.url}/slack/events", content=body, headers=headers)
        assert answer.status_code == 200, answer.text

    async def request_and_approve(self, replica: Replica) -> int:
        """/apply-adr and the Approve click, both to ``replica`` (which then runs the change)."""
        cards = len(self.slack.of("chat.postMessage"))
        form = {"command": "/apply-adr", "text": f"{ADR} tiny", "user_id": "U1",
                "channel_id": "C0INCIDENTS", "team_id": "T0FAKE", "trigger_id": "1.2.3",
                "response_url": self.slack.response_url("cmd"), "token": "legacy"}  # fmt: skip
        await self.post(replica, urllib.parse.urlencode(form).encode())
        deadline = time.monotonic() + 60
        while not (new := [c for c in self.slack.of("chat.postMessage")[cards:] if _approve(c)]):
            assert time.monotonic() < deadline, "no confirmation card was posted"
            await asyncio.sleep(0.05)  # the card follows the ack (and the thread's root)
        card = new[-1]
        payload = {"type": "block_actions", "user": {"id": "U2"}, "team": {"id": "T0FAKE"},
                   "api_app_id": "A0", "trigger_id": "1.2.3",
                   "response_url": self.slack.response_url("btn"), "channel": {"id": "C0INCIDENTS"},
                   "container": {"type": "message"},
                   "actions": [{"type": "button", "action_id": "remediation_approve",
                                "block_id": "b", "value": _approve(card), "action_ts": "1"}]}  # fmt: skip
        await self.post(replica, urllib.parse.urlencode({"payload": json.dumps(payload)}).encode())
        rem = self.remediation()
        assert rem is not None
        return rem.id

    async def until_state(self, remediation_id: int, states: set[str], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            rem = self.remediation(remediation_id)
            if rem is not None and rem.state in states:
                return rem.state
            if time.monotonic() > deadline:
                seen = rem.state if rem else None
                raise AssertionError(f"remediation {remediation_id}: {seen}, not in {states}")
            await asyncio.sleep(0.02)


def _approve(card: Any) -> str | None:
    return next(
        (e["value"] for b in card.args.get("blocks", []) if b["type"] == "actions"
         for e in b["elements"] if e["action_id"] == "remediation_approve"),
        None,
    )  # fmt: skip


def config(tmp_path: Path, *, kube: str, engine: str) -> Path:
    runbooks = tmp_path / "runbooks"
    runbooks.mkdir()
    (runbooks / "test.yaml").write_text(RUNBOOK)
    token = tmp_path / "kube-token"
    token.write_text(TOKEN)
    path = tmp_path / "ruleloop.toml"
    path.write_text(f"""
[slack]
channel = "#incidents"
[paths]
runbooks = "{runbooks}"
adr = "{adr_dir(tmp_path, matching=False)}"
[access]
apply = ["U1"]
approve = ["U1", "U2"]
[remediation]
heartbeat_s = 0.5
stale_after_s = {STALE_S}
[targets.tiny]
vllm_url = "{engine}"
[targets.tiny.actuator]
kind = "kubernetes"
api_url = "{kube}"
namespace = "inference"
deployment = "vllm"
canary_deployment = "vllm-canary"
canary_url = "{engine}"
token_file = "{token}"
poll_interval_s = 0.4
rollout_timeout_s = 60
[targets.tiny.canary]
concurrency = 2
num_requests = 8
prompt_length = 16
output_length = 24
baseline = true
timeout_s = 30
[scheduler]
approval_sweep_every_s = 1
snapshot_every_s = 0
baseline_every_s = 0
draft_reminder_every_s = 0
lease_ttl_s = 2
""")
    return path


@pytest.fixture
async def cluster(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
    slack: FakeSlack,
) -> AsyncIterator[Cluster]:
    kube = FakeKube()
    for name in DEPLOYMENTS:
        kube.add_deployment(name, args=ARGS, replicas=2)
    db = Database(pg_url)
    with KubeServer(kube) as api:
        # one page, always: the engine's counters do not move, so goodput is the canary's own
        async with SseEngine(metrics_pages=PAGES[:1]) as engine:
            env = {**os.environ, "RULELOOP_CONFIG": str(config(tmp_path, kube=api.url,
                   engine=engine.base_url)), "RULELOOP_DATABASE_URL": pg_url,
                   "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_SIGNING_SECRET": SIGNING_SECRET,
                   "SLACK_API_URL": slack.api_url}  # fmt: skip
            env.pop("SLACK_APP_TOKEN", None)
            c = Cluster(tmp_path=tmp_path, db=db, kube=kube, engine=engine, slack=slack, env=env)
            c.survivor = await asyncio.to_thread(c.replica, "b")
            try:
                yield c
            finally:
                c.survivor.proc.stop()
    db.dispose()


# the step to kill replica A in; whether A's canary fails; how the change must end
SCENARIOS = [
    (None, False, "promoted"),
    ("approved", False, "interrupted"),  # measuring the baseline: nothing applied yet
    ("applying", False, "rolled_back"),
    ("canary", False, "rolled_back"),
    ("promoting", False, "rolled_back"),
    ("rolling_back", True, "rolled_back"),  # A's own rollback after a failed canary
]
TERMINAL = {"promoted", "rolled_back", "interrupted", "failed"}


def assert_one_story(trail: list[AuditEntry], killed_in: str | None, final: str) -> None:
    """The audit trail of one change: requested, approved, the dead run's steps up to the
    step it died in, one takeover, the survivor's rollback, one end; each entry's state is
    the one its action names."""
    actions = [e.action.removeprefix("remediation.") for e in trail]
    assert actions[:2] == ["requested", "approved"], actions
    ends = {"promoted", "rolled_back", "rollback_failed", "failed", "dry_run", "cancelled"}
    if killed_in is None:
        assert "resumed" not in actions and actions[-1] == final, actions
        return
    assert actions.count("resumed") == 1, actions
    cut = actions.index("resumed")
    resumed = trail[cut]
    assert resumed.detail["found_in"] == killed_in, (resumed.detail, actions)
    before, after = actions[:cut], actions[cut + 1 :]
    assert not ends & set(before), actions  # the dead run ended nothing
    if final == "interrupted":
        assert resumed.detail["state"] == "interrupted" and after == [], actions
    else:
        assert after == ["rolling_back", "rolled_back"], actions
    states = [e.detail.get("state") for e in trail[1:]]
    assert states[-1] == final, (states, actions)


@pytest.mark.parametrize(
    ("killed_in", "canary_fails", "final"), SCENARIOS, ids=[s[0] or "no-kill" for s in SCENARIOS]
)
async def test_kill_9_at_each_step_of_apply_ends_in_one_consistent_state(
    cluster: Cluster, killed_in: str | None, canary_fails: bool, final: str
) -> None:
    cluster.engine.token_delay_s = FAILING_PACE_S if canary_fails else PASSING_PACE_S
    replica = await asyncio.to_thread(cluster.replica, "a")
    try:
        rem_id = await cluster.request_and_approve(replica)
        if killed_in is not None:
            await cluster.until_state(rem_id, {killed_in}, timeout=60)
            replica.proc.proc.kill()  # SIGKILL: no shutdown, no handing over
            replica.proc.proc.wait()
        # A bound on waiting, generous for a loaded box (not a timing assertion).
        state = await cluster.until_state(rem_id, TERMINAL, timeout=STALE_S + 240)
    finally:
        replica.proc.stop()
    assert state == final, (cluster.remediation(rem_id) or Remediation()).result
    rem = cluster.remediation(rem_id)
    assert rem is not None
    assert_one_story(cluster.trail(rem_id), killed_in, final)
    for name in DEPLOYMENTS:
        args = cluster.kube.args(name)
        if final == "promoted":
            assert read_flags(args)["max-num-batched-tokens"] == 2048 and "sk-secret" in args
        else:  # rolled back (or never changed): exactly the args it had, secret included
            assert args == ARGS, (name, args)
    assert cluster.kube.rolled_out("vllm") and cluster.kube.rolled_out("vllm-canary")
    card = f"{ADR} on tiny: {STATES[final]}"  # the card says so (updated after the step)
    deadline = time.monotonic() + 30
    while (shown := _card(cluster.slack, rem.ts)) != card and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert shown == card


def _card(slack: FakeSlack, ts: str | None) -> str | None:
    updates = [c for c in slack.of("chat.update") if c.args["ts"] == ts]
    return str(updates[-1].args["text"]) if updates else None
