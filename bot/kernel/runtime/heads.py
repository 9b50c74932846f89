"""Request heads with a ceiling and a deadline, for every uvicorn server we run (serve, gateway).

uvicorn's httptools protocol has no limit on a request head: one connection's 301 MB of header
lines grew a server by 300-400 MB, 500,000 headers were served, and a connection that sends a
header line a second (slowloris) stays open forever (the keep-alive timer stops at its first
byte). ``GuardedHttpToolsProtocol`` answers

- a head over ``max_bytes`` (request line and header lines) with **431** and closes: counted
  as it is parsed, and for a head not yet complete from the bytes received, so the parser
  never holds more than the ceiling and one read;
- more than ``max_headers`` header lines with **431** and closes;
- a head unfinished ``timeout_s`` after its first byte (or after the connection opened) with
  **408** and closes. Between requests, idleness is uvicorn's keep-alive timeout.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


@dataclass(frozen=True, slots=True)
class HeadLimits:
    """The largest request head a server reads, and how long it waits for one."""

    max_bytes: int = 64 * 1024
    max_headers: int = 100
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_bytes < 1024 or self.max_headers < 1 or self.timeout_s <= 0:
            raise ValueError(f"unusable head limits: {self}")


class HeadRefused(Exception):
    """Raised in a parser callback to stop parsing a head over the limits."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with ``head_limits`` (see the module's doc)."""

    head_limits: ClassVar[HeadLimits] = HeadLimits()
    _head_timer: asyncio.TimerHandle | None = None
    _refusal: tuple[int, str] | None = None

    @classmethod
    def with_limits(cls, limits: HeadLimits) -> type[GuardedHttpToolsProtocol]:
        """This protocol class with other limits (for ``uvicorn.Config(http=...)``)."""
        return type(cls.__name__, (cls,), {"head_limits": limits})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _start_head(self) -> None:
        self._head_open, self._head_bytes, self._head_parsed, self._head_count = True, 0, 0, 0
        self._stop_head_timer()
        self._head_timer = self.loop.call_later(self.head_limits.timeout_s, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def data_received(self, data: bytes) -> None:
        if self._head_open:
            if self._head_timer is None:  # the next request's first byte starts its clock
                self._start_head()
            self._head_bytes += len(data)
        super().data_received(data)
        # Still unfinished after all it was sent: what the parser holds is about this much.
        if self._head_open and self._head_bytes > self.head_limits.max_bytes:
            self._refuse(431, "request head too large")

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_count += 1
        if self._head_count > self.head_limits.max_headers:
            self._refusal = (431, "too many header lines")
            raise HeadRefused
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count_head(self, size: int) -> None:
        self._head_parsed += size
        if self._head_parsed > self.head_limits.max_bytes:
            self._refusal = (431, "request head too large")
            raise HeadRefused

    def on_headers_complete(self) -> None:
        self._head_open = False
        self._stop_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_open, self._head_bytes, self._head_parsed, self._head_count = True, 0, 0, 0

    def send_400_response(self, msg: str) -> None:
        # A parser error raised by our own callback is a refusal of ours, not a bad request.
        if self._refusal is not None:
            self._refuse(*self._refusal)
        else:
            super().send_400_response(msg)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            self._start_head()  # a pipelined head waits while a response still streams
        elif self._head_open:
            self._refuse(408, "request head not received in time")

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` with a short text and close; nothing more is read."""
        self._head_open = False
        self._stop_head_timer()
        if self.transport.is_closing():
            return
        body = message.encode()
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s"
            % (status, REASONS[status], len(body), body)
        )
        self.transport.close()
