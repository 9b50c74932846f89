"""GET /engine/metrics: the upstream engine's own /metrics page, streamed through verbatim.

Behind a gateway, ``<host>/metrics`` is the gateway's page, so tools that need the engine's
numbers (the canary, the bot's probes) find them here. The engine's status, headers and bytes
pass through unchanged (the query string too); an engine that cannot be reached is a 502 and one
that does not answer in ``SCRAPE_TIMEOUT_S`` a 504, each with a plain-text reason.
"""

from __future__ import annotations

import asyncio

import httpx

from bot.gateway.relay import response_headers, upstream_headers
from bot.gateway.types import Scope, Send

PATH = "/engine/metrics"
UPSTREAM_PATH = "/metrics"
SCRAPE_TIMEOUT_S = 30.0  # until the engine's headers; Prometheus gives up after 10 s anyway
TEXT_HEADERS = [(b"content-type", b"text/plain; charset=utf-8")]


async def serve(client: httpx.AsyncClient, scope: Scope, send: Send) -> None:
    """Answer GET /engine/metrics with the engine's GET /metrics."""
    query = scope.get("query_string") or b""
    target = UPSTREAM_PATH + ("?" + query.decode("latin-1") if query else "")
    url = f"{str(client.base_url).rstrip('/')}{UPSTREAM_PATH}"
    request = client.build_request("GET", target, headers=upstream_headers(scope["headers"]))
    try:
        async with asyncio.timeout(SCRAPE_TIMEOUT_S):
            response = await client.send(request, stream=True)
    except TimeoutError:
        await _text(send, 504, f"the engine's metrics page {url} did not answer within "
                               f"{SCRAPE_TIMEOUT_S:g} s")  # fmt: skip
        return
    except httpx.HTTPError as exc:
        await _text(send, 502, f"the gateway could not reach the engine's metrics page {url} "
                               f"({exc or type(exc).__name__})")  # fmt: skip
        return
    try:
        headers = response_headers(response)
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": headers})  # fmt: skip
        # A failure past this point propagates: the server drops the connection, so the scraper
        # sees a cut page instead of a short one that looks complete.
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        await response.aclose()


async def _text(send: Send, status: int, message: str) -> None:
    body = (message + "\n").encode()
    headers = [*TEXT_HEADERS, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
