"""Request bodies read with a ceiling: a body over the limit is refused (413) as soon as it shows.

Starlette's ``request.body()`` reads everything before anyone can look at it, so an unsigned
400 MB POST cost 800 MB of memory before its 401. Here a declared Content-Length over the limit
is refused before a byte is read, and a streamed (chunked) one once the limit is passed.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import Message

from bot.kernel import RequestRejected


def too_large(limit: int) -> RequestRejected:
    """The 413 refusal, with the limit in its reason."""
    return RequestRejected(f"body over {limit} bytes", status=413)


async def read_body(request: Request, *, limit: int) -> bytes:
    """The whole body if it is at most ``limit`` bytes; RequestRejected (413) otherwise."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def replay(request: Request, body: bytes) -> Request:
    """A request equal to ``request`` whose body (already read) can be read again."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:  # a second read after the body: the client is gone as far as we care
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(request.scope, receive=receive)
