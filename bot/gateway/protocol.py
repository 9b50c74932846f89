"""uvicorn's HTTP/1.1 protocol with the response head sent together with the first body bytes.

uvicorn writes a response's head to the socket the moment the app sends
``http.response.start`` (the ASGI spec says a server must not send anything before the first
body event; uvicorn is the exception). The gateway sends its head together with the engine's
first event, so those were two writes. Traced on this box (fake engine, one stream at a time):
the head's write woke the client, the client preempted the gateway to parse the head, and only
then did the first event leave: 0.3-0.8 ms added to every TTFT (more for clients that do more
per head, such as httpx). Held until the first body write and sent with it in one write, the
client wakes once, with the head and its first token.

Every accepted socket also gets TCP_NODELAY explicitly, whatever the event loop's default, so
a small write is never held back waiting for the client's ACK of the previous one.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from bot.kernel.runtime import GuardedHttpToolsProtocol

INFORMATIONAL = b"HTTP/1.1 1"  # "100 Continue" goes out at once: the client waits for it


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    """Turn off Nagle's algorithm on a TCP transport's socket (a no-op for other sockets)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class HeadWithFirstBody:
    """One response's view of the connection: the head is held and leaves with the next write.

    uvicorn's response cycle writes exactly once for ``http.response.start`` (the head) and once
    per body message, an empty body included. Once the head is out, the cycle writes to the
    connection itself again (nothing in the way of the streamed events); a cycle that closes
    the connection sends what was held first.
    """

    __slots__ = ("_cycle", "_head", "_transport")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = cycle
        self._transport: asyncio.Transport = cycle.transport
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        """Hold the head; send it joined with the write after it."""
        if self._head is None:
            if data.startswith(INFORMATIONAL):
                self._transport.write(data)
            else:
                self._head = data
            return
        self._cycle.transport = self._transport
        self._transport.write(self._head + data)
        self._head = None

    def close(self) -> None:
        """Close the connection, after whatever head is still held."""
        if self._head is not None:
            self._transport.write(self._head)
            self._head = None
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GatewayHttpProtocol(GuardedHttpToolsProtocol):
    """``uvicorn.Config(http=GatewayHttpProtocol)``: httptools, head limits, head with first body.

    The limits on request heads are bot/kernel/runtime/heads.py's, the same as ``ruleloop serve``'s.
    """

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        set_nodelay(transport)
        super().connection_made(transport)

    def on_headers_complete(self) -> None:
        previous = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        # A HEAD response has no body write to carry its head: it goes out as uvicorn sends it.
        if cycle is not previous and self.scope["method"] != "HEAD":
            cycle.transport = HeadWithFirstBody(cycle)  # type: ignore[assignment]
