"""The gateway's upstream over aiohttp's client, for bench/gateway_bench.py's side-by-side run.

Run the gateway with ``-c "import _aiohttp_upstream; ..."``: it replaces the gateway's
httptools transport (bot/gateway/transport.py) by an httpx transport over one
``aiohttp.ClientSession``, so the same relay, admission and accounting run over either client.
Plain http and https both work here (aiohttp's TLS).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import httpx

from bot.gateway import server


class _Body(httpx.AsyncByteStream):
    """aiohttp's response body; closing it unfinished closes the connection (the engine aborts)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except aiohttp.ClientPayloadError as exc:
            raise httpx.RemoteProtocolError(f"upstream broke mid-response: {exc}") from exc

    async def aclose(self) -> None:
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx's transport interface over an aiohttp session (no pool limit, no decompression)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
            )
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in request.headers.raw
            if k.lower() != b"host"
        ]
        try:
            response = await self._session.request(
                request.method, str(request.url), headers=headers, data=await request.aread(),
                allow_redirects=False,
            )  # fmt: skip
        except aiohttp.ClientConnectorError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        except aiohttp.ClientError as exc:
            raise httpx.RemoteProtocolError(str(exc)) from exc
        return httpx.Response(response.status, headers=response.raw_headers, stream=_Body(response))

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


server.UpstreamTransport = AiohttpTransport  # type: ignore[misc,assignment]
