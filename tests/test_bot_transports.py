"""Which Slack transports `ruleloop serve` runs, for each set of credentials (docs/bot.md).

A real `ruleloop serve` process talks to a fake Slack at the wire: the Web API over HTTP
(apps.connections.open answers with a WebSocket URL, the rest as tests/fakes/slack_api.py
answers them) and Socket Mode over a real WebSocket, where the fake sends a slash-command
envelope as Slack does and waits for the bot's ack. Over HTTP the same command is posted to
/slack/events, signed with the signing secret. The command is `/diagnose no-such-target`: the
bot answers it through the command's response_url, so each test sees which transport carried
a command all the way to the bot's answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import WSMsgType, web

from tests.fakes.slack_api import BOT_TOKEN, SIGNING_SECRET, FakeSlack, signed_headers

ROOT = Path(__file__).parent.parent
APP_TOKEN = "xapp-1-A0FAKE-1-test"
USAGE = "unknown target 'no-such-target'; known targets: prod-a"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(response_url: str) -> dict[str, str]:
    return {"command": "/diagnose", "text": "no-such-target", "user_id": "U1",
            "team_id": "T0FAKE", "channel_id": "C0INCIDENTS", "trigger_id": "1.2.3",
            "response_url": response_url}  # fmt: skip


class SocketModeSlack:
    """The Web API and Slack's Socket Mode endpoint, on one local aiohttp server."""

    def __init__(self) -> None:
        # answers the Web API methods as for the other tests (its own HTTP server idles)
        self.web_api = FakeSlack()
        self.opened: list[str] = []  # the app tokens apps.connections.open was called with
        self.acks: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.answers: asyncio.Queue[dict[str, Any]] = asyncio.Queue()  # response_url posts
        self.connected = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    def response_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/response/{name}"

    async def start(self) -> None:
        self.web_api.__enter__()
        app = web.Application()
        app.router.add_post("/api/{method}", self._api)
        app.router.add_get("/link/", self._link)
        app.router.add_post("/response/{name}", self._response)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        self.web_api.__exit__(None, None, None)

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        if method == "apps.connections.open":
            self.opened.append(request.headers.get("Authorization", ""))
            url = f"ws://127.0.0.1:{self.port}/link/?ticket=t-1"
            return web.json_response({"ok": True, "url": url})
        if request.content_type == "application/json":
            args = await request.json()
        else:
            args = dict(await request.post())
        return web.json_response(self.web_api.answer(method, args))

    async def _response(self, request: web.Request) -> web.Response:
        await self.answers.put(await request.json())
        return web.json_response({"ok": True})

    async def _link(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_json({"type": "hello", "num_connections": 1,
                            "connection_info": {"app_id": "A0FAKE"},
                            "debug_info": {"host": "fake-applink"}})  # fmt: skip
        self.connected.set()
        envelope = {"envelope_id": "env-1", "type": "slash_commands",
                    "accepts_response_payload": True,
                    "payload": command(self.response_url("socket"))}  # fmt: skip
        await ws.send_json(envelope)
        async for message in ws:
            if message.type == WSMsgType.TEXT:
                await self.acks.put(json.loads(message.data))
        return ws


@pytest.fixture
async def slack() -> Any:
    fake = SocketModeSlack()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.close()


async def serve(tmp_path: Path, slack: SocketModeSlack, env: dict[str, str]) -> Any:
    """Start `ruleloop serve` with these Slack variables; yield its URL; stop it with SIGTERM."""
    config = tmp_path / "ruleloop.toml"
    config.write_text('[slack]\nchannel = "#incidents"\n[access]\ndiagnose = ["*"]\n'
                      '[targets.prod-a]\nvllm_url = "http://127.0.0.1:9"\n')  # fmt: skip
    full = {k: v for k, v in os.environ.items() if not k.startswith("SLACK_")}
    full.update(env, SLACK_API_URL=slack.api_url, RULELOOP_CONFIG=str(config))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from bot.app.cli import main; main()", "serve", "--port", str(port),
         "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full, cwd=ROOT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as client:
        for _ in range(600):  # the process answers /healthz once both transports are up
            try:
                if (await client.get(f"{url}/healthz")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.communicate()[0]
            await asyncio.sleep(0.2)
        else:
            proc.kill()
            pytest.fail(f"ruleloop serve did not answer /healthz:\n{proc.communicate()[0]}")
    return proc, url


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    return out


async def post_command(url: str, response_url: str) -> httpx.Response:
    body = urllib.parse.urlencode(command(response_url)).encode()
    async with httpx.AsyncClient() as client:
        return await client.post(f"{url}/slack/events", content=body, headers=signed_headers(body))


async def test_app_token_and_signing_secret_serve_both_transports(
    tmp_path: Path, slack: SocketModeSlack
) -> None:
    proc, url = await serve(tmp_path, slack, {"SLACK_BOT_TOKEN": BOT_TOKEN,
                                              "SLACK_SIGNING_SECRET": SIGNING_SECRET,
                                              "SLACK_APP_TOKEN": APP_TOKEN})  # fmt: skip
    try:
        assert slack.opened == [f"Bearer {APP_TOKEN}"]  # connected with the app-level token
        ack = await asyncio.wait_for(slack.acks.get(), timeout=60)
        assert ack["envelope_id"] == "env-1"
        socket_answer = await asyncio.wait_for(slack.answers.get(), timeout=60)
        assert socket_answer["text"] == USAGE
        # ... and POST /slack/events still serves signed requests, and only those
        response = await post_command(url, slack.response_url("http"))
        assert response.status_code == 200
        http_answer = await asyncio.wait_for(slack.answers.get(), timeout=60)
        assert http_answer["text"] == USAGE
        body = urllib.parse.urlencode(command(slack.response_url("forged"))).encode()
        headers = signed_headers(body, secret="not-the-apps-secret")
        async with httpx.AsyncClient() as client:
            forged = await client.post(f"{url}/slack/events", content=body, headers=headers)
        assert forged.status_code == 401
    finally:
        out = stop(proc)
    assert "(transport: Socket Mode; targets: prod-a)" in out


async def test_app_token_alone_turns_http_events_off(
    tmp_path: Path, slack: SocketModeSlack
) -> None:
    proc, url = await serve(tmp_path, slack, {"SLACK_BOT_TOKEN": BOT_TOKEN,
                                              "SLACK_APP_TOKEN": APP_TOKEN})  # fmt: skip
    try:
        ack = await asyncio.wait_for(slack.acks.get(), timeout=60)
        assert ack["envelope_id"] == "env-1"
        assert (await asyncio.wait_for(slack.answers.get(), timeout=60))["text"] == USAGE
        response = await post_command(url, slack.response_url("http"))
        assert response.status_code == 404
        assert "Slack events over HTTP are off" in response.text
        assert slack.answers.empty()
    finally:
        out = stop(proc)
    assert "(transport: Socket Mode; targets: prod-a)" in out


async def test_signing_secret_alone_never_opens_a_socket(
    tmp_path: Path, slack: SocketModeSlack
) -> None:
    proc, url = await serve(tmp_path, slack, {"SLACK_BOT_TOKEN": BOT_TOKEN,
                                              "SLACK_SIGNING_SECRET": SIGNING_SECRET})  # fmt: skip
    try:
        response = await post_command(url, slack.response_url("http"))
        assert response.status_code == 200
        assert (await asyncio.wait_for(slack.answers.get(), timeout=60))["text"] == USAGE
        assert slack.opened == [] and not slack.connected.is_set()
    finally:
        out = stop(proc)
    assert "(transport: Slack; targets: prod-a)" in out
