"""The demo scenario: a bad engine, a mixed workload, an alert, a diagnosis, an applied ADR.

Everything is real except Slack: the console transport prints what the bot would post. The
engine starts with `--max-num-batched-tokens 8192`; chats, long shared-system-prompt requests and
impatient clients load it; an Alertmanager-format alert goes to the bot's own webhook; the bot
diagnoses, matches the shipped CPU ADR, and — once the on-call engineer requests it and a second
person approves — restarts the engine with the fix behind the ADR's canary gates, then drafts
the post-incident ADR.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import httpx

from bot.canary.runner import CanaryRun
from bot.canary.workload import CancelMode, Workload
from bot.config import Settings
from bot.engine.process import EngineManager
from bot.errors import RuleloopError
from bot.server import Bot, create_bot
from bot.store.models import AdrDraft, Incident, Remediation

HERE = Path(__file__).parent
ADR_ID = "ADR-20261129-02"
BAD_FLAGS = ["--enforce-eager", "--max-num-batched-tokens", "8192", "--max-num-seqs", "32"]
ONCALL, APPROVER = "U0ONCALL", "U0LEAD"
TOKEN = "demo-alertmanager-token"
LOAD_LEAD_S = 6.0  # load before the alert fires, so the diagnosis window sees it


def workspace(root: Path, repo_adr: Path | None) -> Path:
    """A fresh directory with the ADRs (the repo's, plus the CPU one) and the demo runbook."""
    ws = root / f"demo-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}"
    (ws / "adr").mkdir(parents=True)
    (ws / "runbooks").mkdir()
    if repo_adr is not None and repo_adr.is_dir():
        for path in repo_adr.glob("ADR-*.md"):
            shutil.copy(path, ws / "adr" / path.name)
    shutil.copy(HERE / f"{ADR_ID}-cpu-demo-scheduler-step.md", ws / "adr")
    shutil.copy(HERE / "runbook.yaml", ws / "runbooks" / "demo.yaml")
    return ws


def settings(ws: Path, *, base_url: str, state_dir: Path) -> Settings:
    """Embedded defaults: one local target, an on-call engineer and an approver."""
    return Settings.model_validate(
        {
            "slack": {"channel": "#inference-incidents"},
            "access": {"diagnose": ["*"], "apply": [ONCALL], "approve": [APPROVER],
                       "review": [APPROVER]},
            "targets": {
                "local": {
                    "vllm_url": base_url,
                    "actuator": {"kind": "local", "flags": BAD_FLAGS,
                                 "state_dir": str(state_dir), "start_timeout_s": 600},
                    "canary": {"concurrency": 4, "num_requests": 32, "prompt_length": 128,
                               "output_length": 48, "background_concurrency": 2,
                               "background_prompt_length": 2048, "background_output_length": 16,
                               "baseline": True},
                    "two_person": True,
                }
            },
            "alertmanager": {"token": TOKEN},
            "paths": {"runbooks": str(ws / "runbooks"), "adr": str(ws / "adr"), "state": str(ws)},
        }
    )  # fmt: skip


def incident_load(base_url: str, duration_s: float) -> list[Workload]:
    """Chats (a fifth of them impatient) beside long requests that share a system prompt."""
    endpoint = f"{base_url}/v1/completions"
    chats = Workload(
        endpoint=endpoint, concurrency=6, num_requests=None, duration_s=duration_s,
        prompt_length=128, output_length=48, cancel_share=0.2, cancel_after_ms=800,
        cancel_mode=CancelMode.ABANDON, seed=1,
    )  # fmt: skip
    agents = Workload(
        endpoint=endpoint, concurrency=2, num_requests=None, duration_s=duration_s,
        prompt_length=2048, prefix_length=1536, output_length=16, seed=2,
    )  # fmt: skip
    return [chats, agents]


def alert(base_url: str) -> bytes:
    """An Alertmanager v4 notification, as the shipped TTFT rule would send it."""
    host = base_url.split("://", 1)[1]
    now = dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")
    labels = {"alertname": "VLLMTimeToFirstTokenP99High", "severity": "critical",
              "instance": host, "ruleloop_target": "local"}  # fmt: skip
    body = {
        "version": "4", "groupKey": '{}:{alertname="VLLMTimeToFirstTokenP99High"}',
        "truncatedAlerts": 0, "status": "firing", "receiver": "ruleloop",
        "groupLabels": {"alertname": labels["alertname"]}, "commonLabels": labels,
        "commonAnnotations": {}, "externalURL": "http://alertmanager:9093",
        "alerts": [{
            "status": "firing", "labels": labels,
            "annotations": {"summary": f"TTFT p99 over 500 ms on {host} (demo)"},
            "startsAt": now, "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph", "fingerprint": "d3m0f1ngerpr1nt0",
        }],
    }  # fmt: skip
    return json.dumps(body).encode()


class Demo:
    """Runs the scenario against an engine already started on ``base_url``."""

    def __init__(
        self,
        *,
        ws: Path,
        base_url: str,
        manager: EngineManager,
        say: Callable[[str], None],
        transcript: TextIO,
    ) -> None:
        self.ws = ws
        self.base_url = base_url
        self._say = say
        self._settings = settings(ws, base_url=base_url, state_dir=manager.state_dir)
        self._transcript = transcript

    async def run(self) -> Path | None:
        """The whole story; returns the drafted ADR file (None when nothing was drafted)."""
        bot = create_bot(self._settings, state_dir=self.ws, console=self._transcript)
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=bot.app), base_url="http://ruleloop"
        )
        try:
            incident_id = await self._incident(bot, client)
            return await self._remediate(bot, incident_id)
        finally:
            await bot.flows.tasks.drain(timeout_s=900)
            await client.aclose()
            await bot.http.aclose()
            bot.db.dispose()

    async def _incident(self, bot: Bot, client: httpx.AsyncClient) -> int:
        self._say(
            "3/7 incident load: 6 chat streams (1 in 5 gives up after 0.8 s) beside 2 streams of "
            "2048-token prompts sharing a 1536-token system prompt ..."
        )
        runs = [CanaryRun(w, metrics_url=None) for w in incident_load(self.base_url, 120.0)]
        load = [asyncio.create_task(run.run()) for run in runs]
        try:
            await asyncio.sleep(LOAD_LEAD_S)
            self._say("4/7 Alertmanager fires VLLMTimeToFirstTokenP99High at the bot's webhook")
            response = await client.post(
                "/alertmanager", content=alert(self.base_url),
                headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
            )  # fmt: skip
            if response.status_code != 202:
                raise RuleloopError(f"the bot refused the alert: {response.text}")
            incident_id = int(response.json()["incident"])
            self._say(f"    incident #{incident_id} opened; diagnosing over an 8 s window ...")
            await bot.flows.tasks.drain(timeout_s=300)
        finally:
            for task in load:
                task.cancel()
            for task in load:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        return incident_id

    async def _remediate(self, bot: Bot, incident_id: int) -> Path | None:
        with bot.db.transaction() as s:
            incident = s.get(Incident, incident_id)
            assert incident is not None
            matches = list((incident.summary or {}).get("matches", []))
        if ADR_ID not in matches:
            self._say(
                f"5/7 the diagnosis matched {matches or 'no ADR'}, not {ADR_ID}: the engine was "
                "not slow enough on this machine to meet its conditions; stopping here"
            )
            return None
        self._say(f"5/7 {ONCALL} asks for {ADR_ID} (as /apply-adr would); {APPROVER} approves")
        ack = await bot.remediation.request(user_id=ONCALL, adr_id=ADR_ID, incident_id=incident_id)
        self._say(f"    bot: {ack}")
        with bot.db.transaction() as s:
            rem = s.query(Remediation).filter_by(incident_id=incident_id).one()
        tokens = bot.remediation.records.tokens(f"remediation:{rem.id}")
        await bot.remediation.click(user_id=APPROVER, token=tokens["approve"])
        self._say(
            "6/7 applying: restart the engine with --max-num-batched-tokens 512, then the canary "
            "(4 chat streams beside 2 long-prompt streams) against the ADR's gates ..."
        )
        await bot.flows.tasks.drain(timeout_s=1200)
        with bot.db.transaction() as s:
            rem = s.get(Remediation, rem.id)  # type: ignore[assignment]
            draft = s.query(AdrDraft).filter_by(incident_id=incident_id).one_or_none()
        self._say(f"7/7 outcome: {rem.state}; post-incident ADR drafted for review")
        return Path(draft.path) if draft is not None else None
