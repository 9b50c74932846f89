"""What the `kill -9` tests of an apply share (tests/test_faults_kill_apply.py for the Kubernetes
actuator, every kind of change; tests/test_faults_kill_apply_git.py for the git one): real
`ruleloop serve` replicas on one store, replica B started first and alive throughout, replica A
(or a `ruleloop tune --target` process) running the change until it is killed with SIGKILL; the
config they read, and what every change must end with (one terminal state, one consistent audit
trail, a card that says so, the target's args exactly as before or as promoted).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select

from bot.change.argv import read_flags
from bot.engine.process import free_port
from bot.kernel.store.db import Database
from bot.kernel.store.models import AuditEntry, Remediation, TuneSession
from bot.remediation.ports import STATES
from tests import store_reads
from tests.fakes.bot import ROOT, RUNBOOK, adr_dir
from tests.fakes.kube_api import FakeKube
from tests.fakes.slack_api import BOT_TOKEN, SIGNING_SECRET, FakeSlack, signed_headers
from tests.fakes.sse_engine import SseEngine
from tests.test_bot_e2e import Process

ADR = "ADR-20260831-01"  # --block-size 32, chunked prefill on, --max-num-batched-tokens 2048
PASSING_PACE_S, FAILING_PACE_S = 0.01, 0.06  # between tokens: TPOT 10 ms passes 35 ms, 60 fails
STALE_S = 6.0  # 12 heartbeats: a loaded machine must not make a live replica look dead
TERMINAL = {"promoted", "rolled_back", "interrupted", "failed"}
# The seed's gates are a p99 against a limit: decided on 528 requests (the canary sizes itself
# up to them), so 16 streams of 12 tokens at the pace above: each run about 4 s.
CANARY = {"concurrency": 16, "num_requests": 8, "prompt_length": 16, "output_length": 12,
          "baseline": True, "timeout_s": 30}  # fmt: skip
SCHEDULER = {"approval_sweep_every_s": 1, "snapshot_every_s": 0, "baseline_every_s": 0,
             "draft_reminder_every_s": 0, "lease_ttl_s": 2}  # fmt: skip


@dataclass
class Replica:
    """One `ruleloop serve` process and where it listens."""

    proc: Process
    url: str

    def kill_9(self) -> None:
        """SIGKILL: no shutdown, no handing over."""
        self.proc.proc.kill()
        self.proc.proc.wait()


@dataclass
class TuneProcess:
    """A `ruleloop tune --target` process (the session's runner) and its log."""

    proc: subprocess.Popen[bytes]
    log: Path

    def kill_9(self) -> None:
        """SIGKILL: no restore of its own."""
        self.proc.kill()
        self.proc.wait()

    def alive(self) -> None:
        """Fails, with the log's end, when the process ended already (before its kill)."""
        assert self.proc.poll() is None, self.log.read_text()[-3000:]


@dataclass
class Cluster:
    """What the replicas share: the store, the fake Kubernetes API, the engine, Slack."""

    tmp_path: Path
    db: Database
    kube: FakeKube
    engine: SseEngine
    slack: FakeSlack
    env: dict[str, str]
    am: str | None = None  # the Alertmanager changes silence the target at (None: no silences)
    survivor: Replica | None = None
    clicks: int = 0

    def replica(self, name: str, env: dict[str, str] | None = None) -> Replica:
        """A `ruleloop serve` process (on ``env``, default the replicas'), started and ready."""
        port = free_port()
        argv = [sys.executable, "-c", "from bot.app.cli import main; main()", "serve", "--port",
                str(port), "--state-dir", str(self.tmp_path / f"state-{name}")]  # fmt: skip
        proc = Process(argv, log=self.tmp_path / f"serve-{name}.log", env=env or self.env)
        url = f"http://127.0.0.1:{port}"
        proc.wait_ready(f"{url}/healthz", timeout=120)
        return Replica(proc, url)

    @contextlib.asynccontextmanager
    async def replica_a(
        self, *, canary_fails: bool, env: dict[str, str] | None = None
    ) -> AsyncIterator[Replica]:
        """Replica A (on ``env``, default the replicas'), whose canary passes or fails by the
        engine's token pace; stopped at the end (if it still runs)."""
        self.engine.token_delay_s = FAILING_PACE_S if canary_fails else PASSING_PACE_S
        replica = await asyncio.to_thread(self.replica, "a", env)
        try:
            yield replica
        finally:
            replica.proc.stop()

    @contextlib.asynccontextmanager
    async def survived(self) -> AsyncIterator[None]:
        """Replica B, the survivor, started now and stopped at the end."""
        self.survivor = await asyncio.to_thread(self.replica, "b")
        try:
            yield
        finally:
            self.survivor.proc.stop()

    @contextlib.contextmanager
    def tuning(self, *argv: str) -> Iterator[TuneProcess]:
        """`ruleloop tune --target tiny` (U1 asks, U2 approved) with ``argv`` (its space and
        workload) as a process of its own on the replicas' config and store; killed at the end
        if it still runs."""
        log = self.tmp_path / "tune.log"
        (self.tmp_path / "tune-adr").mkdir(exist_ok=True)  # where its draft would go
        command = [sys.executable, "-c", "from bot.app.cli import main; main()", "tune",
                   "--target", "tiny", "--requested-by", "U1", "--approved-by", "U2",
                   "--adr-dir", str(self.tmp_path / "tune-adr"), "--title", "Killed",
                   "--date", "2026-12-06", *argv]  # fmt: skip
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=self.env
            )
        tune = TuneProcess(proc, log)
        try:
            yield tune
        finally:
            if proc.poll() is None:
                tune.kill_9()

    def session(self) -> TuneSession | None:
        """The newest tuning session (or drift before-run) in the store."""
        with self.db.transaction() as s:
            return s.scalars(select(TuneSession).order_by(TuneSession.id.desc())).first()

    def session_trail(self, session_id: int) -> list[AuditEntry]:
        with self.db.transaction() as s:
            return [
                e
                for e in store_reads.audit_trail(s)
                if e.action.startswith("tune.") and e.detail.get("tune_session") == session_id
            ]

    def applied(self, deployment: str, flags: dict[str, Any]) -> int:
        """How many PATCHes left ``deployment`` with ``flags`` (all of them) in its args: a
        change applied twice shows as 2 (a rollback's PATCH sets other values)."""
        count = 0
        for patch in self.kube.patches(deployment):
            containers = patch.body["spec"]["template"]["spec"]["containers"]
            now = read_flags(containers[0]["args"])
            count += all(now.get(k) == v for k, v in flags.items())
        return count

    def silences(self) -> list[dict[str, Any]]:
        """Every silence at the Alertmanager (none without one)."""
        import httpx

        if self.am is None:
            return []
        return list(httpx.get(f"{self.am}/api/v2/silences", timeout=10).json())

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

    async def request_and_approve(self, replica: Replica) -> int:
        """/apply-adr and the Approve click, both to ``replica`` (which then runs the change)."""
        self.clicks = await apply_and_approve(self.slack, replica.url, f"{ADR} tiny", self.clicks)
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

    async def until_ended(self, remediation_id: int, *, within_s: float) -> str:
        """The state the change ended in; ``within_s`` past the stale limit: a bound on
        waiting, generous for a loaded box (not a timing assertion)."""
        return await self.until_state(remediation_id, TERMINAL, timeout=STALE_S + within_s)

    def ended(
        self, remediation_id: int, state: str, *, killed_in: str | None, final: str,
        live_left: int = 0,
    ) -> Remediation:  # fmt: skip
        """The change that ended in ``state``: it must be ``final``, told as one story (killed
        in its live stage: ``live_left`` steps not judged)."""
        assert state == final, (self.remediation(remediation_id) or Remediation()).result
        rem = self.remediation(remediation_id)
        assert rem is not None
        trail = [e for e in self.trail(remediation_id) if "silence" not in e.action]
        assert_one_story(trail, killed_in, final, live_left=live_left)  # its silence aside
        return rem

    async def card_says(self, rem: Remediation, final: str) -> None:
        """The card says how the change ended (it is updated after the step)."""
        card = f"{ADR} on tiny: {STATES[final]}"
        deadline = time.monotonic() + 30
        while (shown := _card(self.slack, rem.ts)) != card and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert shown == card


async def apply_and_approve(slack: FakeSlack, bot_url: str, text: str, clicks: int = 0) -> int:
    """``/apply-adr text`` from U1 and U2's Approve click on its card, as signed Slack requests
    to the bot at ``bot_url``; how many requests were signed so far (``clicks`` before)."""
    cards = len(slack.of("chat.postMessage"))
    form = {"command": "/apply-adr", "text": text, "user_id": "U1",
            "channel_id": "C0INCIDENTS", "team_id": "T0FAKE", "trigger_id": "1.2.3",
            "response_url": slack.response_url("cmd"), "token": "legacy"}  # fmt: skip
    await _post(bot_url, urllib.parse.urlencode(form).encode(), clicks + 1)
    deadline = time.monotonic() + 60
    while not (new := [c for c in slack.of("chat.postMessage")[cards:] if _approve(c)]):
        assert time.monotonic() < deadline, "no confirmation card was posted"
        await asyncio.sleep(0.05)  # the card follows the ack (and the thread's root)
    payload = {"type": "block_actions", "user": {"id": "U2"}, "team": {"id": "T0FAKE"},
               "api_app_id": "A0", "trigger_id": "1.2.3",
               "response_url": slack.response_url("btn"), "channel": {"id": "C0INCIDENTS"},
               "container": {"type": "message"},
               "actions": [{"type": "button", "action_id": "remediation_approve",
                            "block_id": "b", "value": _approve(new[-1]), "action_ts": "1"}]}  # fmt: skip
    await _post(
        bot_url, urllib.parse.urlencode({"payload": json.dumps(payload)}).encode(), clicks + 2
    )
    return clicks + 2


async def _post(bot_url: str, body: bytes, click: int) -> None:
    """One signed Slack request; each its own timestamp (the same one twice is a replay)."""
    import httpx

    headers = signed_headers(body, timestamp=int(time.time()) - click)
    async with httpx.AsyncClient(timeout=60) as client:
        answer = await client.post(f"{bot_url}/slack/events", content=body, headers=headers)
    assert answer.status_code == 200, answer.text


def _approve(card: Any) -> str | None:
    return next(
        (e["value"] for b in card.args.get("blocks", []) if b["type"] == "actions"
         for e in b["elements"] if e["action_id"] == "remediation_approve"),
        None,
    )  # fmt: skip


def _card(slack: FakeSlack, ts: str | None) -> str | None:
    updates = [c for c in slack.of("chat.update") if c.args["ts"] == ts]
    return str(updates[-1].args["text"]) if updates else None


def secret_file(tmp_path: Path, name: str, secret: str) -> Path:
    """A token in a file of its own (what the config names, never the token itself)."""
    path = tmp_path / name
    path.write_text(secret)
    return path


def replica_env(
    tmp_path: Path, *, engine: str, actuator: dict[str, Any], pg_url: str, slack: FakeSlack,
    silence: dict[str, Any] | None = None, **more: Any,
) -> dict[str, str]:  # fmt: skip
    """The replicas' environment: their config (``config``, with the target's settings
    ``more``), the shared store, Slack at the fake (no Socket Mode)."""
    path = config(tmp_path, engine=engine, actuator=actuator, silence=silence, **more)
    env = {**os.environ, "RULELOOP_CONFIG": str(path), "RULELOOP_DATABASE_URL": pg_url,
           "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_SIGNING_SECRET": SIGNING_SECRET,
           "SLACK_API_URL": slack.api_url}  # fmt: skip
    env.pop("SLACK_APP_TOKEN", None)
    return env


def config(
    tmp_path: Path, *, engine: str, actuator: dict[str, Any], silence: dict[str, Any] | None = None,
    **more: Any,
) -> Path:  # fmt: skip
    """The replicas' ruleloop.toml: target ``tiny`` served by ``engine`` and changed through
    ``actuator`` (its [targets.tiny.actuator] table), silenced per ``silence`` (its
    [targets.tiny.silence] table, when given), with the target's settings ``more``; heartbeats
    every 0.5 s, stale after STALE_S; U1 applies, U2 approves."""
    target = {"vllm_url": engine, "actuator": actuator, "canary": CANARY, **more}
    if silence is not None:
        target["silence"] = silence
    runbooks = tmp_path / "runbooks"
    runbooks.mkdir()
    (runbooks / "test.yaml").write_text(RUNBOOK)
    settings = {
        "slack": {"channel": "#incidents"},
        "paths": {"runbooks": runbooks, "adr": adr_dir(tmp_path, matching=False)},
        "access": {"apply": ["U1"], "approve": ["U1", "U2"]},
        "remediation": {"heartbeat_s": 0.5, "stale_after_s": STALE_S},
        "targets": {"tiny": target},
        "scheduler": SCHEDULER,
    }
    path = tmp_path / "ruleloop.toml"
    path.write_text(toml_text(settings))
    return path


def toml_text(table: dict[str, Any], name: str = "") -> str:
    """``table`` as TOML: its values (strings, paths, numbers, booleans, lists), then its tables."""
    tables = {k: v for k, v in table.items() if isinstance(v, dict)}
    values = [f"{k} = {json.dumps(v, default=str)}" for k, v in table.items() if k not in tables]
    text = "".join(f"{line}\n" for line in ([f"[{name}]"] if name and values else []) + values)
    return text + "".join(toml_text(v, f"{name}.{k}" if name else k) for k, v in tables.items())


def assert_one_story(
    trail: list[AuditEntry], killed_in: str | None, final: str, *, live_left: int = 0
) -> None:
    """The audit trail of one change: requested, approved, the dead run's steps up to the
    step it died in, one takeover, the survivor's rollback (or, killed in its live stage with
    ``live_left`` steps not judged, the survivor's steps left and the promotion), one end; each
    entry's state is the one its action names."""
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
    elif final == "promoted":  # a live stage goes on where it stopped
        assert after == ["live_step"] * live_left + ["canary_passed", "promoted"], actions
    else:
        assert after == ["rolling_back", "rolled_back"], actions
    states = [e.detail.get("state") for e in trail[1:]]
    assert states[-1] == final, (states, actions)
