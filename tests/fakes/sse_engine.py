"""A real HTTP/1.1 server that streams completions as vLLM does and sees clients hang up.

It answers `GET /v1/models` and streaming `POST /v1/completions`: one SSE event per token, each
with usage (vLLM's `continuous_usage_stats`), then `[DONE]`. With ``hold_after=N`` a stream
stops after N tokens and stays open until the client closes the connection, so only a client
that gives up can end it; ``disconnects`` records how many tokens each such stream had sent.
With ``metrics_pages`` it also answers `GET /metrics` with those pages in turn (recorded vLLM
pages), so a canary that scrapes the engine can run against it. With ``hold_until_scraped`` a
stream waits after its first token until `/metrics` is scraped (since the stream began), so a
canary's run cannot end before the engine has been looked at while it held the stream. With
``count_generation`` each page's `vllm:generation_tokens_total` grows by the tokens streamed
since the server started, as a real engine's does, so a canary reads its own tokens on the
engine's page. With ``first_token_s`` each stream waits that long (by its number) before its
first token, so a test sets the TTFT each request sees. With ``hold_body_end`` a stream's HTTP body ends (the last chunk, after `[DONE]`) only once
``body_end`` is set. ``connections`` counts the TCP connections clients opened to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Sequence
from typing import Any

MODEL = "fake-model"
HOLD_GUARD_S = 30.0  # a held stream goes on after this, so a canary that never scrapes ends


def token_event(i: int, prompt_tokens: int, *, last: bool = False) -> bytes:
    """The SSE event carrying token ``i`` (0-based); the last one says why the answer ended."""
    chunk = {
        "id": "cmpl-fake", "object": "text_completion", "model": MODEL,
        "choices": [{"index": 0, "text": f" t{i}", "finish_reason": "length" if last else None}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": i + 1,
                  "total_tokens": prompt_tokens + i + 1},
    }  # fmt: skip
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


class SseEngine:
    """``async with SseEngine() as engine:`` serves ``engine.base_url`` in this event loop."""

    def __init__(
        self,
        *,
        hold_after: int | None = None,
        token_delay_s: float = 0.0,
        metrics_pages: Sequence[str] = (),
        hold_until_scraped: bool = False,
        hold_body_end: bool = False,
        idle_timeout_s: float | None = None,
        count_generation: bool = False,
        first_token_s: Callable[[int], float] | None = None,
    ) -> None:
        self.hold_after = hold_after
        self.count_generation = count_generation
        self.generated = 0  # tokens streamed, all streams
        self.token_delay_s = token_delay_s  # a slow engine: this long between tokens
        self.first_token_s = first_token_s  # stream number (from 0) -> its wait before token 0
        self.metrics_pages = list(metrics_pages)
        self.hold_until_scraped = hold_until_scraped
        self.hold_body_end = hold_body_end
        self.body_end = asyncio.Event()
        self.idle_timeout_s = idle_timeout_s  # close a kept-alive connection idle this long
        self.idle_closed = 0
        self.connections = 0
        self.scrapes = 0
        self._scraped = asyncio.Condition()
        self.streams = 0
        self.completed = 0
        self.disconnects: list[int] = []
        self.disconnected = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT"""
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> SseEngine:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.connections += 1
        try:
            while await self._request(reader, writer):
                pass  # keep-alive: the next request on the same connection
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed the connection between requests
        except asyncio.CancelledError:
            # Shutdown: end quietly; Python 3.11's start_server callback logs an error for a
            # connection task that ends cancelled.
            pass
        finally:
            self._handlers.discard(task)
            writer.close()

    async def _request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection is done."""
        try:
            async with asyncio.timeout(self.idle_timeout_s):  # as uvicorn's keep-alive timeout
                raw = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            self.idle_closed += 1
            return False
        head = raw.decode("latin-1").split("\r\n")
        method, path, _ = head[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
        body = await reader.readexactly(int(headers.get("content-length") or 0))
        if method == "GET" and path == "/v1/models":
            _json(writer, 200, {"object": "list", "data": [{"id": MODEL}]})
        elif method == "GET" and path == "/metrics" and self.metrics_pages:
            page = self._page(self.metrics_pages[self.scrapes % len(self.metrics_pages)]).encode()
            self.scrapes += 1
            async with self._scraped:
                self._scraped.notify_all()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                + f"Content-Length: {len(page)}\r\n\r\n".encode()
                + page
            )
        elif method == "POST" and path == "/v1/completions":
            return await self._stream(json.loads(body), reader, writer)
        else:
            _json(writer, 404, {"error": {"message": f"no route {method} {path}"}})
        await writer.drain()
        return True

    async def _stream(
        self, body: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        self.streams += 1
        number = self.streams - 1
        scrapes_at_start = self.scrapes
        prompt = body.get("prompt")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else 1
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        tokens = int(body["max_tokens"])
        if self.first_token_s is not None:
            await asyncio.sleep(self.first_token_s(number))
        for i in range(tokens):
            if i == self.hold_after:
                await writer.drain()
                # Mid-response the client sends nothing more: EOF means it hung up.
                await reader.read()
                self.disconnects.append(i)
                self.disconnected.set()
                return False
            _chunk(writer, token_event(i, prompt_tokens, last=i == tokens - 1))
            self.generated += 1
            await writer.drain()
            if i == 0 and self.hold_until_scraped:
                await self._scraped_since(scrapes_at_start)
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
        _chunk(writer, b"data: [DONE]\n\n")
        if self.hold_body_end:
            await writer.drain()
            await self.body_end.wait()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        self.completed += 1
        return True

    def _page(self, page: str) -> str:
        """The recorded page, its generation counter grown by what was streamed if asked."""
        if not self.count_generation:
            return page
        lines = []
        for line in page.splitlines():
            if line.startswith("vllm:generation_tokens_total"):
                name, _, value = line.rpartition(" ")
                line = f"{name} {float(value) + self.generated}"
            lines.append(line)
        return "\n".join(lines) + "\n"

    async def _scraped_since(self, scrapes: int) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(HOLD_GUARD_S), self._scraped:
                await self._scraped.wait_for(lambda: self.scrapes > scrapes)


def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")


def _json(writer: asyncio.StreamWriter, status: int, data: object) -> None:
    payload = json.dumps(data).encode()
    reason = "OK" if status == 200 else "Not Found"
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
