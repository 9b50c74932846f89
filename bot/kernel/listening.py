"""Listening sockets and uvicorn servers for the bot's HTTP commands (serve, agent).

The socket is bound here, not in uvicorn, so a busy port is a clear usage error (exit 2)
instead of uvicorn's own ``sys.exit``; and uvicorn leaves the signals to the command, which
drains its work and exits 0 (uvicorn would re-raise SIGTERM after shutdown: exit 143).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import uvicorn

from bot.kernel.errors import UsageError


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (IPv6 when the host has a colon)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


class QuietServer(uvicorn.Server):
    """uvicorn without its own signal capture: the command installs its handlers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
