"""Imported into the gateway's process by bench/gateway_trace.py: stamps each hop of a request.

Writes ``<hop> <time.time_ns()>`` lines to $RULELOOP_GATEWAY_TRACE: ``arrive`` (the app got the
request), ``upstream_write`` (the request went to the engine), ``read`` (the engine's first token
event reached the gateway's socket callback), ``send0``/``send1`` (around the gateway's send of
that event to the client). Wall-clock nanoseconds, so they line up with tcpdump's timestamps.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from bot.gateway import app, relay, transport

LOG = open(os.environ["RULELOOP_GATEWAY_TRACE"], "a", buffering=1)  # noqa: SIM115
FIRST_TOKEN = re.compile(rb'"completion_tokens":\s*1[,}]')


def _stamp(hop: str) -> None:
    LOG.write(f"{hop} {time.time_ns()}\n")


def _wrap_async(cls: Any, name: str, hop: str) -> None:
    original = getattr(cls, name)

    async def stamped(self: Any, *args: Any, **kwargs: Any) -> Any:
        _stamp(hop)
        return await original(self, *args, **kwargs)

    setattr(cls, name, stamped)


_wrap_async(app.Gateway, "_inference", "arrive")
_wrap_async(transport.UpstreamTransport, "_exchange", "upstream_write")

_on_body = transport._Connection.on_body


def on_body(self: Any, body: bytes) -> None:
    if FIRST_TOKEN.search(body):
        _stamp("read")
    _on_body(self, body)


transport._Connection.on_body = on_body  # type: ignore[method-assign]

_run = relay.Relay.run


async def run(self: Any, **kwargs: Any) -> Any:
    send = kwargs["send"]

    async def stamped_send(message: Any) -> None:
        first = FIRST_TOKEN.search(message.get("body") or b"") is not None
        if first:
            _stamp("send0")
        await send(message)
        if first:
            _stamp("send1")

    kwargs["send"] = stamped_send
    return await _run(self, **kwargs)


relay.Relay.run = run  # type: ignore[method-assign]
