"""One whole incident in a real bot, for the incident page's tests (and the docs' pictures).

An Alertmanager alert is diagnosed (recorded vLLM pages, the seed ADR made to match them), the
ADR is requested with /apply-adr and approved by a second person, the Kubernetes actuator
changes the Deployment (the fake cluster at the wire), the canary gate judges a recorded
passing report with the real judge, the change is promoted and the post-incident ADR drafted.
Slack is the fake at the wire; the page's links are signed on a wall clock the test moves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.adr.models import AdrGates
from bot.canary.verdict import gates_from, judged
from bot.kernel.config import CanarySpec
from bot.kernel.store.models import Incident, Remediation
from bot.remediation.gate import GateRun
from tests.fakes import alerts
from tests.fakes.bot import Harness, harness
from tests.fakes.clock import FakeTime
from tests.fakes.kube_api import FakeKube, KubeActuators
from tests.fakes.slack_api import FakeSlack
from tests.fakes.sse_engine import SseEngine

ADR = "ADR-20260831-01"
SECRET = "incident-page-test-secret-0123456789abcdef"
PUBLIC_URL = "https://ruleloop.example.com"
ARGS = ["--model", "/models/llama-3-8b", "--max-num-batched-tokens", "8192"]
# the canary after the change, as the canary's JSON report holds it
PASSING = {"ttft_ms": {"p99": 180.0}, "tpot_ms": {"p99": 21.5}, "goodput_ratio": 0.99,
           "kv_fragmentation": {"observed": 0.12}, "requests": {"total": 32, "failed": 0}}  # fmt: skip


class Wall:
    """The wall clock (unix seconds) from now on, moving only when told: Slack's request
    signatures are checked on it too, so it starts at the real time."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def recorded_canary(
    base_url: str, spec: CanarySpec, gates: AdrGates, *, shape: object = None,
    **judging: object,
) -> GateRun:
    """The gate's canary: a recorded passing report, judged against the ADR's gates."""
    return judged(PASSING, gates_from(gates))


@dataclass
class Story:
    """The bot after the incident, its incident's id, and the clock its links are signed on."""

    h: Harness
    incident_id: int
    wall: Wall
    slack: FakeSlack

    def summary(self) -> dict[str, Any]:
        with self.h.bot.db.transaction() as s:
            incident = s.get(Incident, self.incident_id)
            assert incident is not None
            return incident.summary.json_dict()

    def remediation(self) -> Remediation:
        with self.h.bot.db.transaction() as s:
            return s.query(Remediation).one()


@asynccontextmanager
async def incident_story(
    tmp_path: Path, slack: FakeSlack, *, web: dict[str, Any] | None = None, remediate: bool = True
) -> AsyncIterator[Story]:
    """The bot with one incident diagnosed and (``remediate``) fixed, drafted; ``web``: the
    `[web]` settings (default: a secret and a public URL)."""
    kube = FakeKube()
    kube.add_deployment("vllm", args=ARGS, replicas=2)
    clock = FakeTime()  # rollouts poll without waiting
    wall = Wall()
    actuator_for = KubeActuators(kube, clock)

    async with SseEngine() as engine:
        spec = {"kind": "kubernetes", "namespace": "inference", "deployment": "vllm",
                "token_file": None, "ca_file": None}  # fmt: skip
        h = harness(
            tmp_path, slack=slack, matching_adr=True,
            bot_options={"actuator_for": actuator_for, "gate": recorded_canary,
                         "wall_clock": wall},
            targets={"prod-a": {"vllm_url": engine.base_url, "actuator": spec}},
            web={"link_secret": SECRET, "public_url": PUBLIC_URL} if web is None else web,
        )  # fmt: skip
        try:
            alert = alerts.alert(ruleloop_target="prod-a")
            response = await h.webhook(alerts.body(alert))
            assert response.status_code == 202, response.text
            incident_id = int(response.json()["incident"])
            await h.bot.tasks.drain()
            if remediate:
                await _fix(h, slack)
            yield Story(h=h, incident_id=incident_id, wall=wall, slack=slack)
        finally:
            await h.close()
            await actuator_for.aclose()


async def _fix(h: Harness, slack: FakeSlack) -> None:
    """/apply-adr by U1, approved by U2; the change is promoted and the draft written."""
    reply = await h.slash(f"{ADR} prod-a", command="/apply-adr")
    assert reply.status_code == 200, reply.text

    async def approve_token() -> str:
        while True:
            for call in reversed(slack.of("chat.postMessage")):
                for block in call.args.get("blocks") or []:
                    for element in block.get("elements") or []:
                        if element.get("action_id") == "remediation_approve":
                            return str(element["value"])
            await asyncio.sleep(0.05)

    token = await asyncio.wait_for(approve_token(), timeout=30)
    await h.click(token, user="U2", action_id="remediation_approve")
    await h.bot.tasks.drain()
