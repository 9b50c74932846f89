"""Runs the agent's app on uvicorn until SIGTERM or SIGINT, then exits 0.

The socket is bound here, not in uvicorn, so a busy port is an OSError the CLI reports as one
line instead of uvicorn's own exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Callable, Iterator

import uvicorn
from starlette.applications import Starlette


class _Server(uvicorn.Server):
    """uvicorn without its own signal capture (it re-raises the signal: exit code 143)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on host:port (IPv6 when the host has a colon)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


async def serve(
    app: Starlette, sock: socket.socket, *, on_started: Callable[[str], None] | None = None
) -> None:
    """Serve ``app`` on ``sock`` until SIGTERM/SIGINT; ``on_started`` gets the base URL."""
    config = uvicorn.Config(
        app, loop="none", http="auto", ws="none", lifespan="off", access_log=False,
        server_header=False, log_level="warning", timeout_graceful_shutdown=5,
    )  # fmt: skip
    server = _Server(config)
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
