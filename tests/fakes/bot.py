"""Assembles a real bot (create_bot) against the fakes: Slack at the wire, recorded /metrics pages."""

from __future__ import annotations

import io
import itertools
import shutil
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from bot.app.server import Bot, create_bot
from bot.kernel.config import Settings
from bot.kernel.store.models import Remediation
from tests.conftest import FIXTURES
from tests.fakes.clock import FakeTime, WallClock
from tests.fakes.nvml import FakeNvml
from tests.fakes.slack_api import BOT_TOKEN, SIGNING_SECRET, FakeSlack, signed_headers

ROOT = Path(__file__).parent.parent.parent
PAGES = [
    (FIXTURES / "vllm-0.32.0" / f"{n}.prom").read_text() for n in ("before", "during", "after")
]
AM_TOKEN = "am-secret-token-0123456789"  # [alertmanager] token: 16 characters at least
RUNBOOK = """
name: test-latency
probes:
  - {probe: vllm_metrics, params: {window_s: 2, interval_s: 1}}
  - {probe: queue_cancel, params: {window_s: 2, interval_s: 1}}
  - {probe: nvml}
findings:
  - {when: vllm_metrics.goodput_ratio > 0.5, severity: info, message: "goodput {value:.1%}"}
  - {when: vllm_metrics.ttft_p99_ms > 1, severity: critical, message: "TTFT p99 {value:.0f} ms"}
"""
MATCHING_ADR = ("match:\n- metric: ttft_p99_ms\n  op: '>'\n  value: 1000.0\n"
                "- metric: goodput_ratio\n  op: <\n  value: 0.8\n")  # fmt: skip


def engine_transport() -> httpx.MockTransport:
    """The engine's /metrics: before, during, after (then after again) for each window."""
    served: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/metrics":
            return httpx.Response(404)
        if not served:
            served.extend(PAGES)
        return httpx.Response(200, text=served.pop(0))

    return httpx.MockTransport(handler)


def adr_dir(tmp_path: Path, *, matching: bool) -> Path:
    """The seed ADR; with ``matching`` its conditions become ones the recorded pages meet."""
    target = tmp_path / "adr"
    target.mkdir(exist_ok=True)  # a second bot on the same store reuses it
    seed = next((ROOT / "adr").glob("ADR-20260831-01-*.md"))
    text = seed.read_text()
    if matching:
        text = text.replace(
            MATCHING_ADR, "match:\n- metric: ttft_p99_ms\n  op: '>'\n  value: 1.0\n"
        )
        assert "value: 1.0" in text
    (target / seed.name).write_text(text)
    return target


@dataclass
class Harness:
    """A bot, its fakes and an ASGI client to call it."""

    bot: Bot
    slack: FakeSlack | None
    client: httpx.AsyncClient
    console: io.StringIO
    time: FakeTime
    wall: WallClock
    _clicks: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def slash(
        self,
        text: str,
        *,
        user: str = "U1",
        timestamp: int | None = None,
        command: str = "/diagnose",
        team: str = "T0FAKE",
    ) -> httpx.Response:
        """POST a signed slash command (/diagnose unless told) from workspace ``team``."""
        body = self.slash_body(text, user=user, command=command, team=team)
        return await self.client.post(
            "/slack/events", content=body, headers=signed_headers(body, timestamp=timestamp)
        )

    def slash_body(
        self, text: str, *, user: str = "U1", command: str = "/diagnose", team: str = "T0FAKE"
    ) -> bytes:
        """The form body of a slash command, as Slack posts it (a trigger_id of its own)."""
        assert self.slack is not None
        form = {"command": command, "text": text, "user_id": user, "channel_id": "C0INCIDENTS",
                "team_id": team, "response_url": self.slack.response_url("cmd"),
                "trigger_id": f"{next(self._clicks)}.2.3", "token": "legacy"}  # fmt: skip
        return urllib.parse.urlencode(form).encode()

    async def click(
        self,
        value: str,
        *,
        user: str = "U1",
        action_id: str = "apply_adr",
        team: str = "T0FAKE",
        user_team: str | None = None,
    ) -> httpx.Response:
        """POST a signed button click (the Apply button unless told); ``user_team``: the
        clicker's home workspace, as Slack sends it for Slack Connect members."""
        assert self.slack is not None
        who = {"id": user, **({"team_id": user_team} if user_team else {})}
        payload = {"type": "block_actions", "user": who, "team": {"id": team},
                   "api_app_id": "A0", "trigger_id": "1.2.3", "response_url": self.slack.response_url("btn"),
                   "channel": {"id": "C0INCIDENTS"}, "container": {"type": "message"},
                   "actions": [{"type": "button", "action_id": action_id, "block_id": "b", "value": value,
                                "action_ts": f"{next(self._clicks)}"}]}  # fmt: skip
        import json

        body = urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()
        return await self.client.post("/slack/events", content=body, headers=signed_headers(body))

    async def approve_change(self, *, approver: str = "U2") -> Remediation:
        """Approve the one change requested (by someone other than its requester) and let it
        run to its end; the remediation as it ended."""
        with self.bot.db.transaction() as s:
            (requested,) = s.scalars(select(Remediation)).all()
        tokens = await self.bot.remediation.records.tokens(f"remediation:{requested.id}")
        await self.bot.remediation.click(user_id=approver, token=tokens["approve"])
        await self.bot.tasks.drain()
        with self.bot.db.transaction() as s:
            done = s.get(Remediation, requested.id)
        assert done is not None
        return done

    async def webhook(self, body: bytes, *, token: str | None = AM_TOKEN) -> httpx.Response:
        """POST an Alertmanager notification."""
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return await self.client.post("/alertmanager", content=body, headers=headers)

    async def close(self) -> None:
        """Finish background work and release clients."""
        await self.bot.tasks.drain()
        await self.client.aclose()
        await self.bot.http.aclose()
        self.bot.db.dispose()


def settings(
    tmp_path: Path,
    *,
    slack: FakeSlack | None,
    matching_adr: bool = False,
    slack_extra: dict[str, Any] | None = None,
    **extra: Any,
) -> Settings:
    """Settings for a test bot: one target (dry-run actuator); U1 may diagnose and apply, U1 and
    U2 may approve, U2 may review drafts. ``slack_extra``: more `[slack]` settings."""
    runbooks = tmp_path / "runbooks"
    runbooks.mkdir(exist_ok=True)
    (runbooks / "test.yaml").write_text(RUNBOOK)
    data: dict[str, Any] = {
        "slack": {"channel": "#incidents"},
        "access": {"diagnose": ["U1"], "apply": ["U1"], "approve": ["U1", "U2"], "review": ["U2"]},
        "targets": {
            "prod-a": {"vllm_url": "http://10.0.0.5:8000", "actuator": {"kind": "dry-run"}}
        },
        "alertmanager": {"token": AM_TOKEN},
        "paths": {"runbooks": str(runbooks), "adr": str(adr_dir(tmp_path, matching=matching_adr))},
        **extra,
    }
    data["slack"].update(slack_extra or {})
    if slack is not None:
        data["slack"].update(
            bot_token=BOT_TOKEN, signing_secret=SIGNING_SECRET, api_url=slack.api_url
        )
    return Settings.model_validate(data)


def harness(
    tmp_path: Path,
    *,
    slack: FakeSlack | None,
    matching_adr: bool = False,
    transport: httpx.AsyncBaseTransport | None = None,
    bot_options: dict[str, Any] | None = None,
    slack_extra: dict[str, Any] | None = None,
    **extra: Any,
) -> Harness:
    """A wired bot whose probes read recorded pages on fake clocks (``extra``: settings)."""
    time = FakeTime()
    wall = WallClock()
    console = io.StringIO()
    bot = create_bot(
        settings(
            tmp_path, slack=slack, matching_adr=matching_adr, slack_extra=slack_extra, **extra
        ),
        state_dir=tmp_path / "state",
        http=httpx.AsyncClient(transport=transport or engine_transport()),
        probe_clock=time.clock,
        sleep=time.sleep,
        nvml=FakeNvml.no_driver(),
        console=console,
        clock=wall.now,
        **(bot_options or {}),
    )
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=bot.app), base_url="http://bot")
    return Harness(bot=bot, slack=slack, client=client, console=console, time=time, wall=wall)


def copy_runbooks(tmp_path: Path) -> Path:
    """The shipped runbooks, copied (for tests that edit them)."""
    target = tmp_path / "shipped-runbooks"
    shutil.copytree(ROOT / "runbooks", target)
    return target
