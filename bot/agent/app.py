"""The agent's HTTP API (Starlette), read-only: GET /snapshot behind a bearer token, GET /healthz.

    GET /snapshot[?max_processes=N]   200: the snapshot (bot/agent/reading.py's fields per GPU)
                                      503: {"error": {"code": "nvml_unavailable", ...}} no driver
                                      500: {"error": {"code": "nvml_error", ...}} NVML failed
                                      401: no or wrong bearer token
    GET /healthz                      200 always while the process serves (no token needed;
                                      the host's name only with the bearer token)

Every answer is JSON, errors included: ``{"error": {"code", "message", "hint"}}``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bot.agent.reading import NvmlUnavailable
from bot.agent.session import NvmlSession
from bot.kernel.runtime import new_error_id

log = logging.getLogger("ruleloop.agent")
MAX_PROCESSES = 100
DEFAULT_PROCESSES = 16


def error(status: int, code: str, message: str, hint: str = "", **headers: str) -> JSONResponse:
    """The one error shape every route answers with."""
    body = {"error": {"code": code, "message": message, "hint": hint}}
    return JSONResponse(body, status_code=status, headers=headers or None)


class Authorizer:
    """Checks ``Authorization: Bearer <token>`` in constant time; None = no auth (opted out)."""

    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token is not None else None

    def refusal(self, request: Request) -> Response | None:
        """None when the request may pass, else the 401 to answer."""
        if self._token is None:
            return None
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token):
            return None
        why = "wrong bearer token" if scheme.lower() == "bearer" else "no bearer token"
        return error(
            401, "unauthorized", f"{why} in the Authorization header",
            "send `Authorization: Bearer <token>` with the agent's token (its --token-file)",
            **{"WWW-Authenticate": 'Bearer realm="ruleloop-agent"'},
        )  # fmt: skip


def _max_processes(request: Request) -> int:
    raw = request.query_params.get("max_processes", str(DEFAULT_PROCESSES))
    # ASCII digits only: str.isdigit() is true of "²", which int() refuses (it was a 500)
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_PROCESSES:
        raise HTTPException(400, f"max_processes must be a whole number 0..{MAX_PROCESSES}")
    return int(raw)


def create_app(session: NvmlSession, *, token: str | None) -> Starlette:
    """The agent's ASGI app over one NVML session."""
    auth = Authorizer(token)

    async def snapshot(request: Request) -> Response:
        refused = auth.refusal(request)
        if refused is not None:
            return refused
        count = _max_processes(request)
        try:
            body = await asyncio.to_thread(session.snapshot, max_processes=count)
        except NvmlUnavailable as exc:
            status = 503 if exc.code == "nvml_unavailable" else 500
            hint = (
                "this host has no NVIDIA driver visible to the agent: run it where the GPUs are "
                "(NVIDIA runtime class, NVIDIA_VISIBLE_DEVICES=all)"
                if status == 503
                else "NVML answered with an error: check `nvidia-smi` and the node's kernel log"
            )
            return error(status, exc.code, str(exc), hint)
        return JSONResponse(body)

    async def healthz(request: Request) -> Response:
        # no token needed (the kubelet's probes); the node's name only to a client with the token
        body = {"status": "ok", "nvml": session.status()}
        if auth.refusal(request) is None:
            body["host"] = session.hostname
        return JSONResponse(body)

    async def http_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        codes = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}
        hint = "the agent serves GET /snapshot and GET /healthz only"
        return error(exc.status_code, codes.get(exc.status_code, "http_error"), exc.detail, hint)

    async def unexpected(_request: Request, exc: Exception) -> Response:
        error_id = new_error_id()
        log.error("unexpected failure (id %s)", error_id, exc_info=exc)
        return error(500, "internal", f"unexpected failure (id {error_id}; see the agent's log)")

    handlers: dict[Any, Any] = {HTTPException: http_error, Exception: unexpected}
    return Starlette(
        routes=[
            Route("/snapshot", snapshot, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        exception_handlers=handlers,
    )
