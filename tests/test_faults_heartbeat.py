"""Item 4 of the reliability faults: the heartbeat and the resume raced.

One failed heartbeat write ended all heartbeats, and the run's `finally` then failed (no draft
although the state was promoted); `resume()` on another replica rolled back a run that was
still alive, which then wrote canary_passed and promoted anyway; staleness compared one
replica's clock with another's. Here two bots (replicas) share one store and one Kubernetes
API (the fake at the wire); the canary is held until the test lets it finish. Times are scaled
down: heartbeats every 0.5 s, stale after 4.5 s (production: 20 s and 90 s). The heartbeats wait
on a fake clock the test moves (``BeatTime``); staleness is judged on the database's clock,
which is real.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from bot.adr.models import AdrGates
from bot.canary.verdict import gates_from, judged
from bot.change.argv import read_flags
from bot.kernel.config import CanarySpec
from bot.kernel.store.dbtime import db_now
from bot.kernel.store.models import AdrDraft, Remediation
from bot.remediation.gate import GateRun
from tests import store_reads
from tests.fakes.bot import Harness, harness
from tests.fakes.clock import FakeTime
from tests.fakes.kube_api import FakeKube, KubeActuators
from tests.fakes.slack_api import FakeSlack
from tests.fakes.sse_engine import SseEngine
from tests.test_remediation_slack import ADR, buttons

pytestmark = pytest.mark.faults
ARGS = ["--model", "/models/llama-3-8b", "--max-num-batched-tokens", "8192"]
BEAT_S, STALE_S = 0.5, 4.5
PASSING = {"ttft_ms": {"p99": 180.0}, "tpot_ms": {"p99": 21.5}, "goodput_ratio": 0.99,
           "kv_fragmentation": {"observed": 0.12}, "requests": {"total": 32, "failed": 0}}  # fmt: skip
# The store refuses heartbeats: writes of heartbeat_at that change nothing else a step does.
REFUSE = (
    "CREATE TRIGGER refuse_heartbeats BEFORE UPDATE OF heartbeat_at ON changes "
    "WHEN NEW.state = OLD.state AND NEW.result IS OLD.result "
    "BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END"
)


class BeatTime:
    """The heartbeats' clock: a heartbeat's ``sleep`` waits until the test moves this time to
    its wake-up (``tick``, ``advance``)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self._asleep = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        wake = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.now + seconds, wake))
        self._asleep.set()
        await wake

    def next_due(self) -> float | None:
        due = [at for at, wake in self._sleepers if not wake.done()]
        return min(due, default=None)

    async def tick(self) -> None:
        """Wake the heartbeat due next; return once it has beaten and sleeps again."""
        at = self.next_due()
        assert at is not None, "no heartbeat is waiting"
        wake = next(w for t, w in self._sleepers if t == at and not w.done())
        self._sleepers.remove((at, wake))
        self.now = at
        self._asleep.clear()
        wake.set_result(None)
        await asyncio.wait_for(self._asleep.wait(), timeout=10)  # ended: it did not sleep again

    async def advance(self, seconds: float) -> None:
        """Move the time on by ``seconds``, waking each heartbeat due meanwhile in turn."""
        until = self.now + seconds
        while (at := self.next_due()) is not None and at <= until:
            await self.tick()
        self.now = until


class HeldCanary:
    """The gate's canary: it starts, then waits until ``release`` is set, then passes."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(
        self, base_url: str, spec: CanarySpec, gates: AdrGates, *, shape: object = None,
        **judging: object,
    ) -> GateRun:
        self.started.set()
        await self.release.wait()
        return judged(PASSING, gates_from(gates))


@dataclass
class Replicas:
    """Two bots on one store, one fake cluster, one fake Slack; the run starts on ``one``."""

    one: Harness
    two: Harness
    kube: FakeKube
    canary: HeldCanary
    slack: FakeSlack
    beats: BeatTime

    def refuse_heartbeats(self) -> None:
        with self.one.bot.db.engine.begin() as connection:
            connection.exec_driver_sql(REFUSE)

    def accept_heartbeats(self) -> None:
        with self.one.bot.db.engine.begin() as connection:
            connection.exec_driver_sql("DROP TRIGGER refuse_heartbeats")

    def remediation(self) -> Remediation:
        with self.one.bot.db.transaction() as s:
            return s.scalars(select(Remediation)).one()

    def actions(self) -> list[str]:
        with self.one.bot.db.transaction() as s:
            trail = store_reads.audit_trail(s)
            return [e.action for e in trail if e.action.startswith("remediation.")]

    def db_now(self) -> Any:
        with self.one.bot.db.engine.connect() as connection:
            return connection.execute(select(db_now())).scalar_one()

    async def start_and_hold(self) -> None:
        """Request on ``one``, approve there; return once the canary is running (held)."""
        reply = await self.one.slash(f"{ADR} prod-a", command="/apply-adr")
        assert reply.status_code == 200, reply.text

        async def card() -> str:  # the confirmation card, posted during or after the ack
            while True:
                cards = [c for c in self.slack.of("chat.postMessage") if buttons(c)]
                if cards:
                    return buttons(cards[-1])["remediation_approve"]
                await asyncio.sleep(0.05)

        approve = await asyncio.wait_for(card(), timeout=30)
        await self.one.click(approve, user="U2", action_id="remediation_approve")
        await asyncio.wait_for(self.canary.started.wait(), timeout=30)
        assert self.remediation().state == "canary"
        assert read_flags(self.kube.args("vllm"))["max-num-batched-tokens"] == 2048  # applied


@pytest.fixture
def kube() -> FakeKube:
    fake = FakeKube()
    fake.add_deployment("vllm", args=ARGS, replicas=2)
    return fake


@pytest.fixture
def caplogged(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.INFO, logger="ruleloop")
    yield caplog


@pytest.fixture
async def replicas(tmp_path: Path, slack: FakeSlack, kube: FakeKube) -> AsyncIterator[Replicas]:
    clock = FakeTime()  # rollouts poll without waiting
    actuator_for = KubeActuators(kube, clock)
    beats = BeatTime()  # both replicas' heartbeats wait on it

    canary = HeldCanary()
    async with SseEngine() as engine:  # serves the completion a rollback verifies
        spec = {"kind": "kubernetes", "namespace": "inference", "deployment": "vllm",
                "token_file": None, "ca_file": None}  # fmt: skip
        settings: dict[str, Any] = {
            "targets": {"prod-a": {"vllm_url": engine.base_url, "actuator": spec}},
            "remediation": {"heartbeat_s": BEAT_S, "stale_after_s": STALE_S},
            "store": {"url": f"sqlite:///{tmp_path / 'shared.db'}"},
        }
        bots = [
            harness(tmp_path, slack=slack, bot_options={"actuator_for": actuator_for,
                    "gate": canary, "heartbeat_sleep": beats.sleep}, **settings)
            for _ in range(2)
        ]  # fmt: skip
        yield Replicas(one=bots[0], two=bots[1], kube=kube, canary=canary, slack=slack, beats=beats)
        canary.release.set()
        for bot in bots:
            await bot.close()
    await actuator_for.aclose()


async def test_heartbeat_writes_failing_for_30_s_end_in_one_run_and_one_state(
    replicas: Replicas, caplogged: pytest.LogCaptureFixture
) -> None:
    """30 s of refused heartbeats (a third of the stale limit; here 1.5 s): the heartbeat
    retries and carries on, the other replica takes nothing over, the run ends promoted and
    drafts its ADR."""
    beats = replicas.beats
    await replicas.start_and_hold()
    replicas.refuse_heartbeats()
    refused_until = beats.now + STALE_S / 3
    while beats.now < refused_until:
        await beats.tick()
        assert await replicas.two.bot.remediation.resume() == 0
    failed = [r for r in caplogged.records if "heartbeat of remediation 1 failed" in r.message]
    assert len(failed) >= 2  # the writes were refused, and retried
    replicas.accept_heartbeats()
    accepted_at = replicas.db_now()

    accepted_beat = beats.now
    while (replicas.remediation().heartbeat_at or accepted_at) <= accepted_at:
        assert beats.now - accepted_beat < BEAT_S * 4  # the heartbeat did not end
        await beats.tick()
    assert await replicas.two.bot.remediation.resume() == 0
    replicas.canary.release.set()
    await replicas.one.bot.tasks.drain()
    assert replicas.remediation().state == "promoted"
    assert replicas.actions() == [
        "remediation.requested", "remediation.approved", "remediation.applying",
        "remediation.canary_started", "remediation.canary_passed", "remediation.promoted",
    ]  # fmt: skip
    assert read_flags(replicas.kube.args("vllm"))["max-num-batched-tokens"] == 2048
    assert len(replicas.kube.patches()) == 1  # applied once, never rolled back
    with replicas.one.bot.db.transaction() as s:  # the run's end was reached: it drafted
        assert len(s.scalars(select(AdrDraft)).all()) == 1


async def test_a_replica_whose_clock_runs_ahead_takes_no_live_run_over(
    replicas: Replicas,
) -> None:
    """Staleness is judged on the database's clock: a replica ten minutes ahead sees a run
    that beats as alive."""
    await replicas.start_and_hold()
    replicas.two.wall.advance(600)
    await replicas.beats.advance(BEAT_S * 2)
    assert await replicas.two.bot.remediation.resume() == 0
    replicas.canary.release.set()
    await replicas.one.bot.tasks.drain()
    assert replicas.remediation().state == "promoted"
    assert "remediation.resumed" not in replicas.actions()


async def test_a_resume_that_takes_over_a_live_run_stops_it_at_its_next_step(
    replicas: Replicas, caplogged: pytest.LogCaptureFixture
) -> None:
    """The run is alive but its heartbeats do not land past the stale limit: the other
    replica takes it over and rolls back; when the live run's canary ends, its next step
    finds the change is not its own and it stops: no canary_passed, no promoted, no patch."""
    await replicas.start_and_hold()
    replicas.refuse_heartbeats()
    await replicas.beats.advance(1.2)  # the heartbeats fail and retry...
    await asyncio.sleep(1.2)  # ...while the database's clock passes the stale limit
    assert await replicas.two.bot.remediation.resume(stale_s=1.0) == 1
    replicas.accept_heartbeats()
    assert replicas.remediation().state == "rolled_back"
    assert replicas.kube.args("vllm") == ARGS
    patches = len(replicas.kube.patches())
    replicas.canary.release.set()  # the live run's canary ends now
    await replicas.one.bot.tasks.drain()
    rem = replicas.remediation()
    assert rem.state == "rolled_back"
    assert replicas.actions() == [
        "remediation.requested", "remediation.approved", "remediation.applying",
        "remediation.canary_started", "remediation.resumed", "remediation.rolling_back",
        "remediation.rolled_back",
    ]  # fmt: skip
    assert replicas.kube.args("vllm") == ARGS and len(replicas.kube.patches()) == patches
    assert any("taken over by another replica" in r.message for r in caplogged.records)
    last = replicas.slack.of("chat.update")[-1].args["text"]
    assert last == f"{ADR} on prod-a: rolled back: the previous flags serve again"
