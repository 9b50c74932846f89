"""The admin endpoint: read and change limits while the gateway runs, behind a bearer token.

  GET   /admin/limits                        the limits in force
  PATCH /admin/limits  {"max_inflight_tokens": 4096, "default_timeout_s": "30s"}
        (PUT is accepted as a synonym) applies the change at once; open streams keep running.
        A body that is not a JSON object (or nests too deeply to read) is a 400; a value that
        is wrong (a bool for a number, an unknown key) a 422 naming the field in ``param``.
  GET   /admin/requests[?last_s=N]           the request records (records.py), as JSON:
        the shape of each admitted request (lengths, arrival, prefix hashes), never content

With no token configured the endpoint answers 403 to everyone (fail closed).
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs

from bot.gateway.limits import Limits, LimitsError, updated
from bot.gateway.relay import send_problem
from bot.gateway.responses import HTTPProblem
from bot.gateway.types import Receive, Scope, Send

PATH = "/admin/limits"
REQUESTS_PATH = "/admin/requests"
MAX_BODY = 64 * 1024


class Admin:
    """Serves /admin/limits; limits are read and replaced through the given callables."""

    def __init__(
        self,
        *,
        token: str | None,
        get_limits: Callable[[], Limits],
        set_limits: Callable[[Limits], None],
        export: Callable[..., Awaitable[None]] | None = None,
    ) -> None:
        self._token = token.encode() if token else None
        self._get = get_limits
        self._set = set_limits
        self._export = export

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one admin request."""
        try:
            if scope["path"] == REQUESTS_PATH and self._export is not None:
                last_s = self._requests(scope)
                await self._export(send, last_s=last_s)
                return
            await send_json(send, 200, await self._handle(scope, receive))
        except HTTPProblem as problem:
            await send_problem(send, problem)

    def _requests(self, scope: Scope) -> float | None:
        """Check a /admin/requests call; the ``last_s`` it asks for (None: all records)."""
        self._authorize(scope)
        if scope["method"] != "GET":
            raise HTTPProblem(405, f"{REQUESTS_PATH} takes GET", code="method_not_allowed")
        query = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
        if "last_s" not in query:
            return None
        try:
            last_s = float(query["last_s"][-1])
        except ValueError:
            last_s = math.nan
        if not last_s > 0 or math.isinf(last_s):
            raise HTTPProblem(
                400, "last_s must be a positive number of seconds", param="last_s",
                code="invalid_request",
            )  # fmt: skip
        return last_s

    async def _handle(self, scope: Scope, receive: Receive) -> dict[str, object]:
        if scope["path"] != PATH:
            raise HTTPProblem(
                404, f"no admin resource {scope['path']}; use {PATH} or {REQUESTS_PATH}",
                code="not_found",
            )  # fmt: skip
        self._authorize(scope)
        method = scope["method"]
        if method == "GET":
            return self._get().as_dict()
        if method not in ("PATCH", "PUT"):
            raise HTTPProblem(405, f"{PATH} takes GET or PATCH", code="method_not_allowed")
        raw = await _read(receive)
        try:
            change = json.loads(raw or b"{}")
        except ValueError:
            raise HTTPProblem(
                400, "the limits change is not valid JSON", code="invalid_request"
            ) from None
        except RecursionError:  # e.g. 30,000 nested arrays: the parser's stack runs out
            raise HTTPProblem(
                400, "the limits change is not usable JSON: nested too deeply",
                code="invalid_request",
            ) from None  # fmt: skip
        if not isinstance(change, dict):
            raise HTTPProblem(
                400, "the limits change must be a JSON object", code="invalid_request"
            )
        try:
            new = updated(self._get(), change)
        except LimitsError as exc:  # JSON read, a value wrong: 422, naming the (first) field
            raise HTTPProblem(
                422, f"limits not changed: {exc}", param=exc.fields[0] if exc.fields else None,
                code="invalid_limits",
            ) from None  # fmt: skip
        self._set(new)
        return new.as_dict()

    def _authorize(self, scope: Scope) -> None:
        if self._token is None:
            raise HTTPProblem(
                403,
                "the admin endpoint is disabled; start the gateway with --admin-token-file "
                "(or RULELOOP_GATEWAY_ADMIN_TOKEN) to enable it",
                type="permission_error",
                code="admin_disabled",
            )
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, token = given.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self._token):
            raise HTTPProblem(
                401,
                "missing or wrong admin token: send 'Authorization: Bearer <token>'",
                type="authentication_error",
                code="invalid_admin_token",
                headers=[(b"www-authenticate", b"Bearer")],
            )


async def _read(receive: Receive) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b""
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise HTTPProblem(413, "limits change too large", code="request_too_large")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def send_json(send: Send, status: int, data: object) -> None:
    """Answer with a JSON body."""
    body = json.dumps(data).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
