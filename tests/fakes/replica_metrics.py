"""A replica's /metrics whose token counters follow a callable: the pod behind a Service.

``ReplicaMetrics(tokens=lambda: ...)`` serves `GET /metrics` at ``base_url`` with
vllm:generation_tokens_total and vllm:request_success_total as the callable says at each
scrape, and its own process start time, so a canary can read one pod's page or every pod's.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

_STARTS = itertools.count(1_700_000_000)  # each replica is its own process


class ReplicaMetrics:
    """``async with ReplicaMetrics(tokens=f, requests=g) as pod:`` serves ``pod.base_url``."""

    def __init__(self, *, tokens: Callable[[], float], requests: Callable[[], float]) -> None:
        self.tokens, self.requests = tokens, requests
        self.started = next(_STARTS)
        self.scrapes = 0
        self._server: asyncio.Server | None = None

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT"""
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def page(self) -> str:
        """The page now."""
        return (
            "# TYPE process_start_time_seconds gauge\n"
            f"process_start_time_seconds {self.started}\n"
            "# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{model_name="m"}} {self.tokens()}\n'
            "# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{finished_reason="length",model_name="m"}} '
            f"{self.requests()}\n"
        )

    async def __aenter__(self) -> ReplicaMetrics:
        self._server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                if head.startswith("GET /metrics "):
                    self.scrapes += 1
                    body, status = self.page().encode(), "200 OK"
                else:
                    body, status = b"not found", "404 Not Found"
                writer.write(
                    f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed the connection
        finally:
            writer.close()
