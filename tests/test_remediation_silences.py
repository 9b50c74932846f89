"""The alert side of a change (Issue 31), against a REAL Alertmanager (prometheus-alertmanager):
while a change runs on prod-a its alerts are silenced (matchers from the target's labels), an
alert posted then does not notify, and the silence is expired when the change is promoted, rolled
back, or rolled back by the replica that resumes a dead run. A dead Alertmanager does not stop
the change: the card says the alerts were not silenced.

The change runs as in test_faults_heartbeat: the real Kubernetes actuator against the fake API,
the canary held until the test lets it end. "Killed" is the run's task cancelled mid-canary: like
kill -9 it writes nothing more (no step, no heartbeat, no expiry; the silence code has no
``finally``), so the other replica's resume finds it stale.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from bot.adr.models import AdrGates
from bot.canary.verdict import gates_from, judged
from bot.engine.process import free_port
from bot.kernel.config import CanarySpec
from bot.kernel.store.models import Remediation
from bot.remediation.gate import GateRun
from tests import store_reads
from tests.alertmanager_process import alertmanager as running_alertmanager
from tests.alertmanager_process import wait
from tests.fakes.bot import Harness, harness
from tests.fakes.clock import FakeTime
from tests.fakes.kube_api import FakeKube, KubeActuators
from tests.fakes.slack_api import FakeSlack
from tests.fakes.sse_engine import SseEngine
from tests.test_faults_heartbeat import ARGS, PASSING, BeatTime
from tests.test_remediation_slack import ADR, buttons

pytestmark = pytest.mark.faults
FAILING = {**PASSING, "tpot_ms": {"p99": 5000.0}}  # far over the seed ADR's TPOT gate


class Notifications(BaseHTTPRequestHandler):
    """Alertmanager's receiver: each notification's alerts' labels."""

    received: list[dict[str, str]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.received.extend(alert["labels"] for alert in body["alerts"])
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def notified() -> Iterator[tuple[int, list[dict[str, str]]]]:
    received: list[dict[str, str]] = []
    server = ThreadingHTTPServer(
        ("127.0.0.1", free_port()), type("H", (Notifications,), {"received": received})
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], received
    server.shutdown()
    server.server_close()


@pytest.fixture
def alertmanager(tmp_path: Path, notified: tuple[int, list[dict[str, str]]]) -> Iterator[str]:
    """A real Alertmanager: one group per alert (by target), sent after 1 s."""
    config = {
        "route": {"receiver": "hook", "group_by": ["alertname", "ruleloop_target"],
                  "group_wait": "1s", "group_interval": "1m", "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [
            {"url": f"http://127.0.0.1:{notified[0]}/", "send_resolved": False}]}],
    }  # fmt: skip
    with running_alertmanager(tmp_path, config) as url:
        yield url


class Canary:
    """The gate's canary: starts, waits for ``release``, then passes (or fails)."""

    def __init__(self, *, passes: bool = True) -> None:
        self.started, self.release, self.passes = asyncio.Event(), asyncio.Event(), passes

    async def __call__(
        self, base_url: str, spec: CanarySpec, gates: AdrGates, *, shape: object = None,
        **judging: object,
    ) -> GateRun:
        self.started.set()
        await self.release.wait()
        return judged(PASSING if self.passes else FAILING, gates_from(gates))


@dataclass
class Change:
    """Two replicas on one store, the fake cluster and Slack, a real Alertmanager."""

    one: Harness
    two: Harness
    canary: Canary
    slack: FakeSlack
    am: str

    def remediation(self) -> Remediation:
        with self.one.bot.db.transaction() as s:
            return s.scalars(select(Remediation)).one()

    def actions(self) -> list[str]:
        with self.one.bot.db.transaction() as s:
            return [e.action for e in store_reads.audit_trail(s) if "silence" in e.action]

    def silences(self) -> list[dict[str, Any]]:
        return list(httpx.get(f"{self.am}/api/v2/silences", timeout=5).json())

    async def start_and_hold(self) -> None:
        """Request on ``one``, approve there; return once the canary runs (held)."""
        reply = await self.one.slash(f"{ADR} prod-a", command="/apply-adr")
        assert reply.status_code == 200, reply.text

        async def card() -> str:
            while not (cards := [c for c in self.slack.of("chat.postMessage") if buttons(c)]):
                await asyncio.sleep(0.05)
            return buttons(cards[-1])["remediation_approve"]

        approve = await asyncio.wait_for(card(), timeout=30)
        await self.one.click(approve, user="U2", action_id="remediation_approve")
        await asyncio.wait_for(self.canary.started.wait(), timeout=30)

    def card_texts(self) -> list[str]:
        """Each card update, text and blocks, as one string."""
        return [json.dumps(c.args) for c in self.slack.of("chat.update")]


async def changes(
    tmp_path: Path, slack: FakeSlack, am: str, *, passes: bool = True
) -> AsyncIterator[Change]:
    kube = FakeKube()
    kube.add_deployment("vllm", args=ARGS, replicas=2)
    actuator_for, beats, canary = KubeActuators(kube, FakeTime()), BeatTime(), Canary(passes=passes)
    async with SseEngine() as engine:  # serves the completion a rollback verifies
        spec = {"kind": "kubernetes", "namespace": "inference", "deployment": "vllm",
                "token_file": None, "ca_file": None}  # fmt: skip
        target = {"vllm_url": engine.base_url, "actuator": spec,
                  "silence": {"alertmanager_url": am, "change_s": 600, "settle_s": 120}}  # fmt: skip
        settings: dict[str, Any] = {
            "targets": {"prod-a": target},
            "remediation": {"heartbeat_s": 0.5, "stale_after_s": 4.5},
            "store": {"url": f"sqlite:///{tmp_path / 'shared.db'}"},
        }
        bots = [
            harness(tmp_path, slack=slack, bot_options={"actuator_for": actuator_for,
                    "gate": canary, "heartbeat_sleep": beats.sleep}, **settings)
            for _ in range(2)
        ]  # fmt: skip
        yield Change(one=bots[0], two=bots[1], canary=canary, slack=slack, am=am)
        canary.release.set()
        for bot in bots:
            await bot.close()
    await actuator_for.aclose()


@pytest.fixture
async def change(tmp_path: Path, slack: FakeSlack, alertmanager: str) -> AsyncIterator[Change]:
    async for made in changes(tmp_path, slack, alertmanager):
        yield made


def fire(am: str, target: str) -> None:
    alert = {"labels": {"alertname": "VLLMTimeToFirstTokenP99High", "ruleloop_target": target}}
    assert httpx.post(f"{am}/api/v2/alerts", json=[alert], timeout=5).status_code == 200


async def test_the_target_is_silenced_while_the_change_runs_and_again_loud_after_promote(
    change: Change, notified: tuple[int, list[dict[str, str]]]
) -> None:
    await change.start_and_hold()
    [silence] = change.silences()
    assert silence["status"]["state"] == "active"
    assert silence["matchers"] == [
        {"name": "ruleloop_target", "value": "prod-a", "isRegex": False, "isEqual": True}
    ]
    assert silence["createdBy"] == "ruleloop"
    assert f"change #1: {ADR} on prod-a" in silence["comment"]
    assert "incident: https://" in silence["comment"]  # the card's link in the incident thread
    assert change.remediation().silence == {**change.remediation().silence, "id": silence["id"]}
    assert any(f"silence {silence['id']}: alerts silenced until" in t for t in change.card_texts())
    # an alert of the target inside the silence does not notify; another target's does
    fire(change.am, "prod-a")
    fire(change.am, "prod-b")
    received = notified[1]
    await asyncio.to_thread(wait, lambda: received, what="prod-b's notification",
                            log=Path("/dev/null"))  # fmt: skip
    await asyncio.sleep(1.5)  # prod-a's group was due at the same group_wait
    assert [labels["ruleloop_target"] for labels in received] == ["prod-b"]

    change.canary.release.set()
    await change.one.bot.tasks.drain()
    assert change.remediation().state == "promoted"
    [silence] = change.silences()
    assert silence["status"]["state"] == "expired"
    assert change.remediation().silence["expired"] is True
    assert change.actions() == ["remediation.silenced", "remediation.silence_expired"]
    assert "expired (alerts notify again)" in change.card_texts()[-1]


@pytest.fixture
async def failing_change(
    tmp_path: Path, slack: FakeSlack, alertmanager: str
) -> AsyncIterator[Change]:
    async for made in changes(tmp_path, slack, alertmanager, passes=False):
        yield made


async def test_the_silence_is_expired_after_a_rollback(failing_change: Change) -> None:
    await failing_change.start_and_hold()
    assert [s["status"]["state"] for s in failing_change.silences()] == ["active"]
    failing_change.canary.release.set()
    await failing_change.one.bot.tasks.drain()
    assert failing_change.remediation().state == "rolled_back"
    assert [s["status"]["state"] for s in failing_change.silences()] == ["expired"]
    assert failing_change.actions() == ["remediation.silenced", "remediation.silence_expired"]


async def test_a_silence_left_by_a_killed_run_is_expired_by_the_replica_that_resumes_it(
    change: Change,
) -> None:
    await change.start_and_hold()
    [run] = [t for t in change.one.bot.tasks._tasks if t.get_name().startswith("remediation-")]
    run.cancel()  # replica one dies mid-canary: nothing more is written
    await asyncio.wait([run])
    assert change.remediation().state == "canary"
    assert [s["status"]["state"] for s in change.silences()] == ["active"]
    await asyncio.sleep(0.3)  # the database's clock passes the (test's) stale limit
    assert await change.two.bot.remediation.resume(stale_s=0.2) == 1
    assert change.remediation().state == "rolled_back"
    assert [s["status"]["state"] for s in change.silences()] == ["expired"]
    assert change.remediation().silence["expired"] is True


@pytest.fixture
async def dead_am_change(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[Change]:
    async for made in changes(tmp_path, slack, f"http://127.0.0.1:{free_port()}"):
        yield made


async def test_a_dead_alertmanager_does_not_stop_the_change_and_the_card_says_so(
    dead_am_change: Change,
) -> None:
    await dead_am_change.start_and_hold()
    assert dead_am_change.remediation().state == "canary"  # the change went on
    assert any("alerts NOT silenced: Alertmanager did not answer" in t
               for t in dead_am_change.card_texts())  # fmt: skip
    dead_am_change.canary.release.set()
    await dead_am_change.one.bot.tasks.drain()
    assert dead_am_change.remediation().state == "promoted"
    assert dead_am_change.actions() == ["remediation.silence_failed"]
