"""A small real HTTP server that fakes the Slack Web API at the wire, and records every call.

Serves auth.test, chat.postMessage, chat.update, chat.postEphemeral, the files upload v2 trio
(files.getUploadURLExternal, the upload URL itself, files.completeUploadExternal: only into a
channel the bot is a member of, ``not_in_channel`` otherwise, as Slack answers),
conversations.join (public channels only), users.info, usergroups.users.list and
response_url posts. ``rate_limit(method, times)`` makes the next calls answer 429;
``outage(mode)`` takes Slack down at the wire until ``recover()``: every Web API call and
upload answers 503 (an HTML page, as a load balancer in front of a failing Slack does) or 429,
or the port refuses connections. A channel in ``missing`` is ``channel_not_found``.
Runs in a thread, so a bot in this process or in a subprocess can reach it.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BOT_TOKEN = "xoxb-test-token"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
CHANNEL_IDS = {"#incidents": "C0INCIDENTS", "#inference-incidents": "C0INCIDENTS"}


@dataclass
class Call:
    """One request the fake received."""

    method: str  # the API method, "upload" or "response_url"
    args: dict[str, Any]
    headers: dict[str, str]
    status: int = 200
    body: bytes = b""
    at: float = field(default_factory=time.time)


class FakeSlack:
    """Start with ``with FakeSlack() as slack:``; point the bot at ``slack.api_url``."""

    def __init__(self, *, token: str = BOT_TOKEN) -> None:
        self.token = token
        self.calls: list[Call] = []
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}  # (channel, ts) -> latest
        self.usergroups: dict[str, list[str]] = {}  # user group (subteam) ID -> member IDs
        # channels the bot is a member of (uploads need it), and the private ones (no join)
        self.joined: set[str] = set(CHANNEL_IDS.values())
        self.private: set[str] = set()
        # user ID -> home workspace, for users of another one (Slack Connect); others: T0FAKE
        self.user_teams: dict[str, str] = {}
        self.missing: set[str] = set()  # channels chat.postMessage answers channel_not_found
        self.down: str | None = None  # "5xx" | "429" | "refuse" while an outage lasts
        self._ts = itertools.count(1)
        self._limits: dict[str, list[int]] = {}
        self._changed = threading.Condition()
        self._server = self._serve(0)
        self._port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _serve(self, port: int) -> ThreadingHTTPServer:
        server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        server.daemon_threads = True
        return server

    @property
    def url(self) -> str:
        """http://127.0.0.1:PORT"""
        return f"http://127.0.0.1:{self._port}"

    @property
    def api_url(self) -> str:
        """The Web API base URL (slack_sdk's base_url)."""
        return f"{self.url}/api/"

    def response_url(self, name: str = "r1") -> str:
        """A response_url for a slash command or button payload."""
        return f"{self.url}/response/{name}"

    def __enter__(self) -> FakeSlack:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.down != "refuse":
            self._server.shutdown()
            self._server.server_close()

    def outage(self, mode: str = "5xx") -> None:
        """Slack is down until ``recover()``: "5xx" (503), "429" (Retry-After 30) or "refuse"
        (the port is closed: connections are refused)."""
        assert mode in ("5xx", "429", "refuse") and self.down is None, mode
        if mode == "refuse":
            self._server.shutdown()
            self._server.server_close()
        self.down = mode

    def recover(self) -> None:
        """Slack is back, on the same port."""
        if self.down == "refuse":
            self._server = self._serve(self._port)
            self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
            self._thread.start()
        self.down = None

    def rate_limit(self, method: str, *, times: int = 1, retry_after: int = 1) -> None:
        """Answer the next ``times`` calls of ``method`` with 429 and Retry-After."""
        self._limits[method] = [times, retry_after]

    def of(self, method: str) -> list[Call]:
        """Recorded calls of one method that were answered 200."""
        return [c for c in self.calls if c.method == method and c.status == 200]

    def wait_for(self, method: str, count: int = 1, *, timeout: float = 120.0) -> list[Call]:
        """Block until ``count`` successful calls of ``method`` arrived; AssertionError if not."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.of(method)) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [(c.method, c.status) for c in self.calls]
                    raise AssertionError(f"no {count} x {method} within {timeout} s; seen {seen}")
                self._changed.wait(left)
        return self.of(method)

    async def until(self, method: str, count: int = 1, *, timeout: float = 120.0) -> list[Call]:
        """``wait_for`` without blocking the event loop (for bots running in this process)."""
        import asyncio

        return await asyncio.to_thread(self.wait_for, method, count, timeout=timeout)

    # --- what each method answers ---------------------------------------------------------
    def answer(self, method: str, args: dict[str, Any]) -> dict[str, Any]:
        """The JSON answer of an API method."""
        if method == "auth.test":
            return {
                "ok": True,
                "url": "https://fake.slack.com/",
                "team": "Fake",
                "user": "ruleloop",
                "team_id": "T0FAKE",
                "user_id": "U0BOT",
                "bot_id": "B0BOT",
            }
        if method == "chat.postMessage":
            channel = CHANNEL_IDS.get(args.get("channel", ""), args.get("channel", ""))
            if not channel or args.get("channel") in self.missing:
                return {"ok": False, "error": "channel_not_found"}
            ts = f"1790000000.{next(self._ts):06d}"
            message = {
                "ts": ts,
                "text": args.get("text"),
                "blocks": _blocks(args),
                "thread_ts": args.get("thread_ts"),
            }
            self.messages[(channel, ts)] = message
            return {"ok": True, "channel": channel, "ts": ts, "message": message}
        if method == "chat.update":
            key = (args.get("channel", ""), args.get("ts", ""))
            if key not in self.messages:
                return {"ok": False, "error": "message_not_found"}
            self.messages[key].update(text=args.get("text"), blocks=_blocks(args))
            return {"ok": True, "channel": key[0], "ts": key[1], "text": args.get("text")}
        if method == "chat.getPermalink":
            key = (args.get("channel", ""), args.get("message_ts", ""))
            if key not in self.messages:
                return {"ok": False, "error": "message_not_found"}
            link = f"https://fake.slack.com/archives/{key[0]}/p{key[1].replace('.', '')}"
            return {"ok": True, "channel": key[0], "permalink": link}
        if method == "chat.postEphemeral":
            return {"ok": True, "message_ts": f"1790000000.{next(self._ts):06d}"}
        if method == "files.getUploadURLExternal":
            file_id = f"F{next(self._ts):08d}"
            return {"ok": True, "upload_url": f"{self.url}/upload/{file_id}", "file_id": file_id}
        if method == "files.completeUploadExternal":
            channel = args.get("channel_id") or args.get("channels", "")
            if channel and channel not in self.joined:
                return {"ok": False, "error": "not_in_channel"}
            files = args.get("files")
            files = json.loads(files) if isinstance(files, str) else files
            return {"ok": True, "files": [{"id": f["id"], "title": f.get("title")} for f in files]}
        if method == "conversations.join":
            channel = args.get("channel", "")
            if channel in self.private:
                return {"ok": False, "error": "method_not_supported_for_channel_type"}
            self.joined.add(channel)
            return {"ok": True, "channel": {"id": channel, "is_member": True}}
        if method == "users.info":
            user = args.get("user", "")
            team = self.user_teams.get(user, "T0FAKE")
            return {"ok": True, "user": {"id": user, "team_id": team, "is_bot": False}}
        if method == "usergroups.users.list":
            group = args.get("usergroup", "")
            if group not in self.usergroups:
                return {"ok": False, "error": "no_such_subteam"}
            return {"ok": True, "users": list(self.usergroups[group])}
        return {"ok": False, "error": "unknown_method"}


def _blocks(args: dict[str, Any]) -> Any:
    blocks = args.get("blocks")
    return json.loads(blocks) if isinstance(blocks, str) else blocks


def _handler(fake: FakeSlack) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep test output quiet
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            parts = urllib.parse.urlsplit(self.path)
            path = parts.path
            if fake.down in ("5xx", "429") and path.startswith(("/api/", "/upload/")):
                method = path[len("/api/") :] if path.startswith("/api/") else "upload"
                if fake.down == "429":
                    self._record(Call(method, {}, headers, status=429))
                    body = json.dumps({"ok": False, "error": "ratelimited"}).encode()
                    return self._send(429, body, "application/json", {"Retry-After": "30"})
                self._record(Call(method, {}, headers, status=503))
                page = b"<html><body><h1>503 Service Unavailable</h1></body></html>"
                return self._send(503, page, "text/html")
            if path.startswith("/upload/"):
                self._record(Call("upload", {"file_id": path.rsplit("/", 1)[1]}, headers, body=raw))
                return self._send(200, b"OK - %d" % len(raw), "text/plain")
            if path.startswith("/response/"):
                args = json.loads(raw or b"{}")
                self._record(
                    Call("response_url", {"name": path.rsplit("/", 1)[1], **args}, headers)
                )
                return self._send(200, b"ok", "text/plain")
            if not path.startswith("/api/"):
                return self._send(404, b"not found", "text/plain")
            method = path[len("/api/") :]
            query = {k: v[0] for k, v in urllib.parse.parse_qs(parts.query).items()}
            args = {**query, **_parse(raw, headers.get("content-type", ""))}
            limit = fake._limits.get(method)
            if limit and limit[0] > 0:
                limit[0] -= 1
                self._record(Call(method, args, headers, status=429))
                body = json.dumps({"ok": False, "error": "ratelimited"}).encode()
                return self._send(429, body, "application/json", {"Retry-After": str(limit[1])})
            if headers.get("authorization") != f"Bearer {fake.token}":
                answer: dict[str, Any] = {"ok": False, "error": "invalid_auth"}
            else:
                try:
                    answer = fake.answer(method, args)
                except (KeyError, TypeError, ValueError) as exc:
                    answer = {"ok": False, "error": "invalid_arguments", "detail": str(exc)}
            self._record(Call(method, args, headers, status=200 if answer["ok"] else 400))
            return self._send(200, json.dumps(answer).encode(), "application/json")

        do_GET = do_POST  # read methods (usergroups.users.list) come as GET with a query

        def _record(self, call: Call) -> None:
            with fake._changed:
                fake.calls.append(call)
                fake._changed.notify_all()

        def _send(
            self, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

    return Handler


def _parse(raw: bytes, content_type: str) -> dict[str, Any]:
    if "json" in content_type:
        return dict(json.loads(raw or b"{}"))
    return {k: v[0] for k, v in urllib.parse.parse_qs(raw.decode()).items()}


def signed_headers(
    body: bytes, *, secret: str = SIGNING_SECRET, timestamp: int | None = None
) -> dict[str, str]:
    """Headers Slack would send with this body: timestamp and v0 signature."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    # the bytes as sent (slack_sdk's own signer decodes them as UTF-8 first)
    digest = hmac.new(secret.encode(), b"v0:%s:%s" % (ts.encode(), body), hashlib.sha256)
    signature = f"v0={digest.hexdigest()}"
    return {
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": signature,
        "Content-Type": "application/x-www-form-urlencoded",
    }
