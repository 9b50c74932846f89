"""Runs the agent's app on uvicorn until SIGTERM or SIGINT, then exits 0.

The socket comes bound from ``bot.kernel.listening.bind``, so a busy port is a one-line usage error.
Request heads have the same ceiling and deadline as ``ruleloop serve``'s and the gateway's
(bot/kernel/runtime/heads.py): the agent listens on a GPU node's network.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import Callable

import uvicorn
from starlette.applications import Starlette

from bot.kernel import QuietServer
from bot.kernel.runtime import GuardedHttpToolsProtocol, HeadLimits


async def serve(
    app: Starlette, sock: socket.socket, *, on_started: Callable[[str], None] | None = None,
    head_limits: HeadLimits | None = None,
) -> None:  # fmt: skip
    """Serve ``app`` on ``sock`` until SIGTERM/SIGINT; ``on_started`` gets the base URL."""
    protocol = GuardedHttpToolsProtocol
    if head_limits is not None:
        protocol = protocol.with_limits(head_limits)
    # log_config=None: uvicorn's own lines go through the command's handler (--log-format)
    config = uvicorn.Config(
        app, loop="none", http=protocol, ws="none", lifespan="off", access_log=False,
        server_header=False, log_level="warning", log_config=None, timeout_graceful_shutdown=5,
    )  # fmt: skip
    server = QuietServer(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started and on_started is not None:
            host, port = sock.getsockname()[:2]
            on_started(f"http://{f'[{host}]' if ':' in host else host}:{port}")
        await task
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
