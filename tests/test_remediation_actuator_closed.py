"""Each change builds its actuator once and closes it: no Kubernetes API client is left open.

The real KubernetesActuator builds its own API client (as in production) against the fake
cluster at the wire; the factory keeps every actuator the bot built, so the test sees both how
many there were and that each client was closed, whether the change was kept, rolled back,
refused after the actuator was asked, or resumed by a restarted bot.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from bot.adr.models import AdrGates
from bot.canary.verdict import gates_from, judged
from bot.change.actuators import kube_read
from bot.change.actuators.kubernetes import KubernetesActuator
from bot.kernel.config import CanarySpec, KubernetesActuatorSpec, Target
from bot.kernel.store.models import Remediation
from bot.remediation.gate import GateRun
from tests.fakes.bot import Harness, harness
from tests.fakes.clock import FakeTime
from tests.fakes.kube_api import TOKEN, FakeKube
from tests.fakes.slack_api import FakeSlack
from tests.fakes.sse_engine import SseEngine
from tests.test_remediation_slack import ADR, buttons

ARGS = ["--model", "/models/llama-3-8b", "--max-num-batched-tokens", "8192"]
REPORT = {"ttft_ms": {"p99": 180.0}, "tpot_ms": {"p99": 21.5}, "goodput_ratio": 0.99,
          "kv_fragmentation": {"observed": 0.12}, "requests": {"total": 32, "failed": 0}}  # fmt: skip
SLOW = REPORT | {"ttft_ms": {"p99": 9000.0}}  # fails the ADR's TTFT gate


@dataclass
class Built:
    """The bot's ``actuator_for``: real KubernetesActuators, each with the client it built."""

    kube: FakeKube
    clock: FakeTime = field(default_factory=FakeTime)  # rollouts poll without waiting
    actuators: list[KubernetesActuator] = field(default_factory=list)

    def __call__(self, name: str, target: Target) -> KubernetesActuator:
        assert isinstance(target.actuator, KubernetesActuatorSpec)
        actuator = KubernetesActuator(
            target.actuator, vllm_url=target.vllm_url, sleep=self.clock.sleep,
            monotonic=self.clock.clock,
        )  # fmt: skip
        self.actuators.append(actuator)
        return actuator

    def open_clients(self) -> int:
        return sum(not a._http.is_closed for a in self.actuators)


@dataclass
class Canary:
    """The gate: a recorded report, judged by the ADR's gates (the real judge)."""

    report: dict[str, Any]

    async def __call__(
        self, base_url: str, spec: CanarySpec, gates: AdrGates, *, shape: object = None,
        **judging: object,
    ) -> GateRun:
        return judged(self.report, gates_from(gates))


@dataclass
class Rig:
    bot: Harness
    built: Built
    canary: Canary
    slack: FakeSlack

    async def change(self) -> Remediation:
        """/apply-adr, approved by another user; the change once the bot is done with it."""
        reply = await self.bot.slash(f"{ADR} prod-a", command="/apply-adr")
        assert reply.status_code == 200, reply.text
        approve = await asyncio.wait_for(self._card(), timeout=30)
        await self.bot.click(approve, user="U2", action_id="remediation_approve")
        await self.bot.bot.tasks.drain()
        with self.bot.bot.db.transaction() as s:
            return s.scalars(select(Remediation).order_by(Remediation.id.desc())).first()

    async def _card(self) -> str:
        seen = len([c for c in self.slack.of("chat.postMessage") if buttons(c)])
        while True:
            cards = [c for c in self.slack.of("chat.postMessage") if buttons(c)]
            if len(cards) > seen or (cards and seen == len(cards) and self._pending()):
                return buttons(cards[-1])["remediation_approve"]
            await asyncio.sleep(0.05)

    def _pending(self) -> bool:
        with self.bot.bot.db.transaction() as s:
            return any(r.state == "pending" for r in s.scalars(select(Remediation)))


@pytest.fixture
async def rig(
    tmp_path: Path, slack: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Rig]:
    kube = FakeKube()
    kube.add_deployment("vllm", args=ARGS, replicas=2)
    real_client = kube_read.client

    def client(*args: Any, **kwargs: Any) -> httpx.AsyncClient:  # production's, at the wire
        return real_client(*args, **{**kwargs, "transport": kube.transport})

    monkeypatch.setattr(kube_read, "client", client)
    built, canary = Built(kube), Canary(REPORT)
    token = tmp_path / "kube-token"
    token.write_text(TOKEN)
    async with SseEngine() as engine:  # serves the completion a rollback verifies
        spec = {"kind": "kubernetes", "namespace": "inference", "deployment": "vllm",
                "api_url": "https://kube.test", "token_file": str(token), "ca_file": None}  # fmt: skip
        bot = harness(
            tmp_path, slack=slack, bot_options={"actuator_for": built, "gate": canary},
            targets={"prod-a": {"vllm_url": engine.base_url, "actuator": spec}},
        )  # fmt: skip
        yield Rig(bot=bot, built=built, canary=canary, slack=slack)
        await bot.close()


@pytest.mark.parametrize(("report", "ends"), [(REPORT, "promoted"), (SLOW, "rolled_back")])
async def test_a_kept_change_and_a_rolled_back_one_close_every_client(
    rig: Rig, report: dict[str, Any], ends: str
) -> None:
    rig.canary.report = report
    change = await rig.change()
    assert change.state == ends, change.result
    assert len(rig.built.actuators) == 2  # one to read what serves, one for the change
    assert rig.built.open_clients() == 0


async def test_a_request_refused_after_reading_the_target_closes_its_client(rig: Rig) -> None:
    assert (await rig.change()).state == "promoted"
    reply = await rig.bot.slash(f"{ADR} prod-a", command="/apply-adr")  # the flags serve now
    assert reply.status_code == 200
    (*_, answer) = await rig.slack.until("response_url", 2)
    assert "already runs with" in answer.args["text"]
    assert len(rig.built.actuators) == 3
    assert rig.built.open_clients() == 0


async def test_a_change_a_restarted_bot_rolls_back_closes_its_client(rig: Rig) -> None:
    """The bot stopped mid-canary (the change left in state canary, silent): resume rolls it
    back with an actuator of its own, and closes it."""
    assert (await rig.change()).state == "promoted"
    with rig.bot.bot.db.transaction() as s:
        rem = s.scalars(select(Remediation)).one()
        rem.state, rem.heartbeat_at = "canary", None  # as a replica that died mid-canary left it
    built_before = len(rig.built.actuators)
    assert await rig.bot.bot.remediation.resume(stale_s=0) == 1
    with rig.bot.bot.db.transaction() as s:
        assert s.scalars(select(Remediation)).one().state == "rolled_back"
    assert len(rig.built.actuators) == built_before + 1
    assert rig.built.open_clients() == 0
