"""Imported into the gateway's process by bench/gateway_trace.py: stamps each hop of a request.

Writes ``<hop> <time.time_ns()> [<id>]`` lines to $RULELOOP_GATEWAY_TRACE. ``id`` is the
request's ``x-trace-id`` header when the client sent one (the 200-stream trace does, so each
line belongs to one request); the lone-stream trace sends none. Hops:

  accept          uvicorn accepted the client's connection (written with the request's id
                  when the request arrives; the stamp is the accept's)
  arrive          the app got the request (its task started)
  admitted        body read, parsed, costed and admitted: the relay starts
  connect0/1      around opening a new upstream connection (absent when one was reused)
  upstream_write  the request went to the engine's socket
  upstream_head   the engine's response head was parsed (vLLM has queued the request)
  read            the engine's first token event reached the gateway's socket callback
  send0/send1     around the gateway's send of that event to the client

and for the disconnect-drain trace (ids starting ``drain``): ``tokens <ns> <id> <n>`` for every
chunk read from the engine (n: the last completion_tokens in it), ``sent <ns> <id> <n>`` for
every chunk written to the client, ``disconnect`` (the gateway
saw the client leave) and ``upstream_close`` (it closed the engine's connection).

Every garbage collection the gateway's process runs is written as ``gc<generation> <start ns>
<seconds>`` (no request id), so a trace can line the collector's pauses up with the hops.

Wall-clock nanoseconds, so they line up with tcpdump's timestamps and the client's stamps.
"""

from __future__ import annotations

import contextvars
import gc
import os
import re
import time
from typing import Any

from bot.gateway import app, protocol, relay, transport

LOG = open(os.environ["RULELOOP_GATEWAY_TRACE"], "a", buffering=1)  # noqa: SIM115
FIRST_TOKEN = re.compile(rb'"completion_tokens":\s*[1-9]')  # a loaded vLLM merges tokens
USAGE = re.compile(rb'"completion_tokens":\s*(\d+)')
TRACE_ID = re.compile(rb"\r\nx-trace-id: *([^\r]+)\r\n", re.IGNORECASE)
ACCEPTED: dict[int, int] = {}  # client port -> when its connection was accepted
CURRENT: contextvars.ContextVar[str] = contextvars.ContextVar("trace_id", default="")


def _stamp(hop: str, tid: str = "") -> None:
    LOG.write(f"{hop} {time.time_ns()} {tid}\n" if tid else f"{hop} {time.time_ns()}\n")


_gc_start = 0


def _on_gc(phase: str, info: dict[str, int]) -> None:
    global _gc_start
    if phase == "start":
        _gc_start = time.time_ns()
    else:
        LOG.write(f"gc{info['generation']} {_gc_start} {(time.time_ns() - _gc_start) / 1e9:.6f}\n")


gc.callbacks.append(_on_gc)


def _header(headers: Any) -> str:
    for key, value in headers:
        if key == b"x-trace-id":
            return value.decode()
    return ""


_inference = app.Gateway._inference


async def inference(self: Any, scope: Any, receive: Any, send: Any, *, chat: bool) -> None:
    tid = _header(scope["headers"])
    CURRENT.set(tid)
    _stamp("arrive", tid)
    accepted = ACCEPTED.get((scope.get("client") or ("", 0))[1])
    if tid and accepted:
        LOG.write(f"accept {accepted} {tid}\n")
    await _inference(self, scope, receive, send, chat=chat)


app.Gateway._inference = inference  # type: ignore[method-assign]

_connection_made = protocol.GatewayHttpProtocol.connection_made


def connection_made(self: Any, transport_: Any) -> None:
    peer = transport_.get_extra_info("peername")
    if peer:
        ACCEPTED[peer[1]] = time.time_ns()
    _connection_made(self, transport_)


protocol.GatewayHttpProtocol.connection_made = connection_made  # type: ignore[method-assign]

_connect = transport.UpstreamTransport._connect


async def connect(self: Any, key: Any, timeout: Any) -> Any:
    tid = CURRENT.get()
    if tid:
        _stamp("connect0", tid)
    conn = await _connect(self, key, timeout)
    if tid:
        _stamp("connect1", tid)
    return conn


transport.UpstreamTransport._connect = connect  # type: ignore[method-assign]

_exchange = transport.UpstreamTransport._exchange


async def exchange(self: Any, conn: Any, payload: bytes) -> Any:
    m = TRACE_ID.search(payload, 0, payload.find(b"\r\n\r\n") + 2)
    tid = m.group(1).decode() if m else ""
    conn.trace_id = tid
    conn.first_seen = False
    _stamp("upstream_write", tid)
    response = await _exchange(self, conn, payload)
    if tid:
        _stamp("upstream_head", tid)
    return response


transport.UpstreamTransport._exchange = exchange  # type: ignore[method-assign]

_on_body = transport._Connection.on_body


def on_body(self: Any, body: bytes) -> None:
    tid = getattr(self, "trace_id", "")
    if not getattr(self, "first_seen", True) and FIRST_TOKEN.search(body):
        self.first_seen = True
        _stamp("read", tid)
    if tid.startswith("drain"):
        counts = USAGE.findall(body)
        if counts:
            LOG.write(f"tokens {time.time_ns()} {tid} {int(counts[-1])}\n")
    _on_body(self, body)


transport._Connection.on_body = on_body  # type: ignore[method-assign]

_run = relay.Relay.run


async def run(self: Any, **kwargs: Any) -> Any:
    send = kwargs["send"]
    tid = _header(kwargs["headers"])
    if tid:
        _stamp("admitted", tid)
    seen = False

    async def stamped_send(message: Any) -> None:
        nonlocal seen
        body = message.get("body") or b""
        first = not seen and FIRST_TOKEN.search(body) is not None
        if first:
            seen = True
            _stamp("send0", tid)
        await send(message)
        if first:
            _stamp("send1", tid)
        if tid.startswith("drain") and (counts := USAGE.findall(body)):
            LOG.write(f"sent {time.time_ns()} {tid} {int(counts[-1])}\n")

    kwargs["send"] = stamped_send
    return await _run(self, **kwargs)


relay.Relay.run = run  # type: ignore[method-assign]

_wait_disconnect = relay._wait_disconnect


async def wait_disconnect(receive: Any) -> None:
    await _wait_disconnect(receive)
    _stamp("disconnect", CURRENT.get())


relay._wait_disconnect = wait_disconnect

_close = transport._Connection.close


def close(self: Any) -> None:
    tid = getattr(self, "trace_id", "")
    if tid.startswith("drain") and not self.closed:
        _stamp("upstream_close", tid)
    _close(self)


transport._Connection.close = close  # type: ignore[method-assign]
