"""Serving the gateway: the default upstream client, uvicorn settings, and SIGHUP reload.

``GatewayServer`` runs the app on uvicorn (uvloop + httptools) inside the running event loop, as
an async context manager, so the CLI, the tests and the bench start it the same way. Its
protocol (protocol.py) sends each response's head together with the first body bytes.

A server that owns its process (the CLI) freezes the objects alive once it serves out of the
garbage collector (``gc.freeze``): the modules, uvicorn's and the app's own state never become
garbage, but every full collection walked all of them. A burst of 200 streams allocates enough
to set one off, and traced at 200 concurrent streams a full collection stopped the gateway for
24-59 ms in 2 of 5 bursts, each time while the burst's requests were still on their way to the
engine; with the start-up objects frozen it takes about 1 ms (docs/gateway.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import httpx
import uvicorn

from bot.gateway.app import Gateway
from bot.gateway.limits import LimitsError, read_limits_file, updated
from bot.gateway.protocol import GatewayHttpProtocol
from bot.gateway.transport import UpstreamClient, UpstreamTransport
from bot.kernel.runtime import HeadLimits

log = logging.getLogger("ruleloop.gateway")


def upstream_client(upstream: str, *, connect_timeout_s: float = 10.0) -> httpx.AsyncClient:
    """The upstream client: the lean transport, no read timeout (deadlines are the gateway's)."""
    return UpstreamClient(
        transport=UpstreamTransport(),
        base_url=upstream.rstrip("/"),
        timeout=httpx.Timeout(None, connect=connect_timeout_s),
        follow_redirects=False,
        trust_env=False,
    )


def reload_limits(gateway: Gateway, path: Path) -> bool:
    """Apply the limits file to the running gateway; log and keep the old limits if it is bad."""
    try:
        gateway.set_limits(updated(gateway.limits, read_limits_file(path)))
    except LimitsError as exc:
        log.error("limits not reloaded: %s", exc)
        return False
    log.warning("limits reloaded from %s: %s", path, gateway.limits.as_dict())
    return True


class _Server(uvicorn.Server):
    """uvicorn without its own signal capture: the owner decides which signals stop it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class GatewayServer:
    """Runs a Gateway on uvicorn in this event loop until the context exits.

    With ``handle_signals`` (the CLI) SIGINT and SIGTERM stop it cleanly (exit 0) and SIGHUP
    re-reads ``limits_file``; without (tests, the bench) it installs no signal handler at all.
    ``freeze_gc`` (default: as ``handle_signals``, i.e. when the server owns its process) moves
    every object alive once the server has started out of the garbage collector's reach, so a
    full collection during a burst walks only what the burst made (see the module's doc).
    ``head_limits``: the largest request head it reads and how long it waits for one (431/408).
    """

    def __init__(
        self,
        gateway: Gateway,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        limits_file: Path | None = None,
        handle_signals: bool = False,
        freeze_gc: bool | None = None,
        log_level: str = "warning",
        head_limits: HeadLimits | None = None,
    ) -> None:
        self.gateway = gateway
        self.limits_file = limits_file
        self.handle_signals = handle_signals
        self.freeze_gc = handle_signals if freeze_gc is None else freeze_gc
        protocol = GatewayHttpProtocol.with_limits(head_limits or HeadLimits())
        config = uvicorn.Config(
            gateway, host=host, port=port, loop="none", http=protocol, ws="none",
            lifespan="off", access_log=False, server_header=False, date_header=False,
            log_level=log_level, backlog=4096, timeout_keep_alive=30, timeout_graceful_shutdown=30,
        )  # fmt: skip
        self.server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def base_url(self) -> str:
        """http://host:port the gateway listens on (the real port when 0 was asked for)."""
        sock = self.server.servers[0].sockets[0]
        host, port = sock.getsockname()[:2]
        return f"http://{host}:{port}"

    async def __aenter__(self) -> GatewayServer:
        # Bind here, not in uvicorn: a busy port is then an OSError we can report, not sys.exit.
        config = self.server.config
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((config.host, config.port))
        except OSError:
            sock.close()
            raise
        # Handlers first: the server answers as soon as it starts, and a SIGHUP sent by whoever
        # saw it answer must reload the limits, not kill the process (its default action).
        if self.handle_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.stop)
            if self.limits_file is not None:
                path = self.limits_file
                loop.add_signal_handler(signal.SIGHUP, lambda: reload_limits(self.gateway, path))
        self._task = asyncio.create_task(self.server.serve(sockets=[sock]))
        while not self.server.started:
            if self._task.done():
                self._task.result()  # raises why it could not start
                raise RuntimeError("the gateway server stopped before it started")
            await asyncio.sleep(0.01)
        if self.freeze_gc:
            gc.collect()  # what start-up left as garbage goes now, not frozen forever
            gc.freeze()
        return self

    def stop(self) -> None:
        """Ask the server to finish: stop accepting, let open responses end, return."""
        self.server.should_exit = True

    async def wait(self) -> None:
        """Serve until the server stops (Ctrl-C or SIGTERM in the CLI)."""
        assert self._task is not None
        await self._task

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.handle_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(sig)
        self.server.should_exit = True
        if self._task is not None:
            await self._task
