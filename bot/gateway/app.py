"""The gateway as a raw ASGI app: routing, admission, and the bookkeeping around each exchange.

  POST /v1/completions, /v1/chat/completions   costed, admitted against the token budget,
                                               deadline-bound, counted in the metrics
  GET  /metrics                                the gateway's own metrics (see metrics.py)
  GET  /engine/metrics                         the engine's /metrics, verbatim (engine_page.py)
  /admin/limits                                live limits (see admin.py)
  /admin/requests                              the request records (see records.py)
  the engine paths of PASSTHROUGH              passed through to the engine as sent
  anything else                                404, never forwarded

Routing is on the path exactly as the client sent it (``raw_path``), and only a path that has
one reading gets that far: a request target that is not a plain absolute path (``*``, dot
segments, ``//``, a backslash, any percent-encoding) is a 400. A path the gateway lets through
is then the path the engine routes on, byte for byte: no spelling of /v1/completions reaches
the engine without the budget, the deadline and the counting (the upstream URL removes dot
segments, the engine decodes ``%2f``; neither can turn an unknown path into a known one).

Order of checks for an inference request: timeout header, body size, JSON, model and prompt,
budget. A request refused at any of them is answered here and never reaches the engine.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable

import httpx

from bot.gateway import engine_page, responses
from bot.gateway.admin import Admin
from bot.gateway.budget import TokenBudget
from bot.gateway.costing import Cost, Costing, bad_request, parse_body
from bot.gateway.deadlines import HEADER as TIMEOUT_HEADER
from bot.gateway.deadlines import BadTimeout, request_timeout
from bot.gateway.limits import Limits
from bot.gateway.metrics import CONTENT_TYPE, GatewayMetrics, RelayOutcome
from bot.gateway.records import MAX_RECORDS, Recorder
from bot.gateway.relay import Exchange, Relay, send_problem, upstream_headers
from bot.gateway.responses import HTTPProblem
from bot.gateway.split import Split, StageCounts, relay_split
from bot.gateway.types import Receive, Scope, Send

INFERENCE_PATHS = {"/v1/completions": False, "/v1/chat/completions": True}  # path -> is chat
# The engine's paths the gateway forwards (path -> methods): reads and tokenizer calls, none of
# which holds the engine's capacity. Generation anywhere else (/v1/embeddings, /v1/responses,
# /invocations, which vLLM dispatches to completions or chat by the body) and vLLM's operator
# endpoints (/reset_prefix_cache, /sleep, /v1/load_lora_adapter...) would bypass the limits.
PASSTHROUGH: dict[str, tuple[str, ...]] = {
    "/v1/models": ("GET", "HEAD"),
    "/health": ("GET", "HEAD"),
    "/ping": ("GET", "HEAD"),
    "/version": ("GET", "HEAD"),
    "/tokenize": ("POST",),
    "/detokenize": ("POST",),
}
OWN_PATHS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(INFERENCE_PATHS, ("POST",)),
    "/metrics": ("GET",),
    engine_page.PATH: ("GET",),
}
_AMBIGUOUS = re.compile(rb"//|\\|%|(?:^|/)\.\.?(?:/|$)")


class ClientGone(Exception):
    """The client disconnected before its request body arrived."""


class Gateway:
    """An ASGI reverse proxy for one OpenAI-compatible engine; the upstream client is injected.
    With ``canary`` (a second engine's client and its share of requests) the inference requests
    are split between the two (split.py)."""

    def __init__(
        self,
        *,
        client: httpx.AsyncClient,
        canary: tuple[httpx.AsyncClient, float] | None = None,
        limits: Limits | None = None,
        costing: Costing | None = None,
        admin_token: str | None = None,
        clock: Callable[[], float] = time.perf_counter,
        record_requests: int = MAX_RECORDS,
    ) -> None:
        self.limits = limits or Limits()
        self.budget = TokenBudget(self.limits.max_inflight_tokens)
        self.metrics = GatewayMetrics(self.budget, upstream=getattr(client, "upstream", None))
        self.costing = costing or Costing()
        self.relay = Relay(client, clock=clock)
        self.split: Split | None = None
        if canary is not None:
            self.split = Split(self.relay, Relay(canary[0], clock=clock), weight=canary[1])
            self.stages = StageCounts(self.metrics.registry)
        self.recorder = Recorder(record_requests)
        self.admin = Admin(
            token=admin_token, get_limits=lambda: self.limits, set_limits=self.set_limits,
            export=self.recorder.export,
        )  # fmt: skip
        self._clock = clock

    def set_limits(self, limits: Limits) -> None:
        """Put new limits in force; admitted requests keep their admission."""
        self.limits = limits
        self.budget.limit = limits.max_inflight_tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            path = route_path(scope)
        except HTTPProblem as problem:
            await send_problem(send, problem)
            return
        if path.startswith("/admin/"):
            await self.admin(scope, receive, send)
            return
        methods = OWN_PATHS.get(path) or PASSTHROUGH.get(path)
        if methods is None:
            await send_problem(send, responses.no_such_path(path, [*OWN_PATHS, *PASSTHROUGH]))
            return
        if scope["method"] not in methods:
            await send_problem(send, responses.wrong_method(path, methods))
            return
        chat = INFERENCE_PATHS.get(path)
        if chat is not None:
            await self._inference(scope, receive, send, chat=chat)
        elif path == "/metrics":
            body = self.metrics.exposition()
            length = str(len(body)).encode()
            headers = [(b"content-type", CONTENT_TYPE), (b"content-length", length)]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        elif path == engine_page.PATH:
            await engine_page.serve(self.relay.client, scope, send)
        else:
            await self._passthrough(scope, receive, send)

    async def _inference(self, scope: Scope, receive: Receive, send: Send, *, chat: bool) -> None:
        loop = asyncio.get_running_loop()
        arrived, arrived_s, arrived_at = loop.time(), self._clock(), self.recorder.wall_clock()
        limits = self.limits
        try:
            timeout_s, raw = await self._read_request(scope, receive, limits)
            body = parse_body(raw)
            cost = self.costing.estimate(
                body, chat=chat, default_max_tokens=limits.default_max_tokens
            )
        except ClientGone:
            return
        except HTTPProblem as problem:
            await self._refuse(send, problem, RelayOutcome.INVALID)
            return
        try:
            self._admit(cost, limits)
        except HTTPProblem as problem:
            await self._refuse(send, problem, RelayOutcome.REJECTED)
            return
        self.metrics.admitted(cost.prompt_tokens)
        ex: Exchange | None = None

        def send_to(relay: Relay, fail_over: bool = False) -> Awaitable[Exchange]:
            return relay.run(
                method="POST", target=_target(scope), headers=upstream_headers(scope["headers"]),
                body=raw, receive=receive, send=send, stream=cost.stream,
                deadline_s=timeout_s - (loop.time() - arrived),
                role_events=(body.get("n") or 1) if chat else 0, fail_over=fail_over,
            )  # fmt: skip

        try:
            if self.split is None:
                ex = await send_to(self.relay)
            else:
                ex = await relay_split(self.split, self.stages, send_to)
        finally:
            self.budget.release(cost.total)
            self._account(ex, cost, arrived_s=arrived_s)
            self._record(body, ex, cost, chat=chat, at=arrived_at, took=loop.time() - arrived)

    async def _refuse(self, send: Send, problem: HTTPProblem, outcome: RelayOutcome) -> None:
        self.metrics.refused(outcome)
        await send_problem(send, problem)

    def _admit(self, cost: Cost, limits: Limits) -> None:
        if not self.budget.fits_at_all(cost.total):
            raise responses.over_whole_budget(cost.total, self.budget.limit)
        if not self.budget.try_admit(cost.total):
            raise responses.budget_spent(
                cost.total, self.budget.in_flight_tokens, self.budget.limit, limits.retry_after_s
            )

    def _account(self, ex: Exchange | None, cost: Cost, *, arrived_s: float) -> None:
        if ex is None:  # cancelled from outside (server shutdown)
            self.metrics.finished(RelayOutcome.CLIENT_CANCEL, prompt_tokens=cost.prompt_tokens,
                                  output_tokens=0, ttft_s=None, tpot_s=None)  # fmt: skip
            return
        ttft = tpot = None
        if cost.stream and ex.first_byte_s is not None:
            ttft = ex.first_byte_s - arrived_s
            tokens = ex.output_tokens
            if ex.last_byte_s is not None and tokens > 1:
                tpot = (ex.last_byte_s - ex.first_byte_s) / (tokens - 1)
        self.metrics.finished(ex.outcome, prompt_tokens=cost.prompt_tokens,
                              output_tokens=ex.output_tokens, ttft_s=ttft, tpot_s=tpot)  # fmt: skip

    def _record(
        self, body: dict[str, object], ex: Exchange | None, cost: Cost, *, chat: bool, at: float,
        took: float,
    ) -> None:  # fmt: skip
        if ex is not None and ex.prompt_tokens is not None:
            prompt, prompt_from = ex.prompt_tokens, "usage"
        else:
            prompt_from = "ids" if not chat and _token_ids(body.get("prompt")) else "estimate"
            prompt = cost.prompt_tokens
        if ex is None:
            output, output_from, outcome = 0, "events", RelayOutcome.CLIENT_CANCEL.value
        else:
            output, outcome = ex.output_tokens, ex.outcome.value
            output_from = "usage" if ex.usage_tokens is not None else "events"
        self.recorder.record(
            body=body, chat=chat, at=at, outcome=outcome, duration_s=took, prompt_tokens=prompt,
            prompt_from=prompt_from, output_tokens=output, output_from=output_from,
        )  # fmt: skip

    async def _read_request(
        self, scope: Scope, receive: Receive, limits: Limits
    ) -> tuple[float, bytes]:
        timeout_header = declared = None
        for key, value in scope["headers"]:
            if key == TIMEOUT_HEADER:
                timeout_header = value.decode("latin-1")
            elif key == b"content-length":
                declared = value
        if timeout_header is None and limits.require_timeout_header:
            raise responses.timeout_header_required()
        try:
            timeout_s = request_timeout(
                timeout_header, default_s=limits.default_timeout_s, max_s=limits.max_timeout_s
            )
        except BadTimeout as exc:
            raise bad_request(str(exc), "X-Request-Timeout") from None
        return timeout_s, await read_body(receive, limit=limits.max_body_bytes, declared=declared)

    async def _passthrough(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            raw = await read_body(receive, limit=self.limits.max_body_bytes, declared=None)
        except ClientGone:
            return
        except HTTPProblem as problem:
            await send_problem(send, problem)
            return
        await self.relay.run(
            method=scope["method"], target=_target(scope), body=raw, receive=receive, send=send,
            headers=upstream_headers(scope["headers"]), deadline_s=self.limits.max_timeout_s,
            stream=True,
        )  # fmt: skip


def _token_ids(prompt: object) -> bool:
    """A token-id prompt (or a batch of them): its length is the exact token count."""
    return isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], str)


def route_path(scope: Scope) -> str:
    """The path to route on: the request target's path as sent; 400 when it has two readings.

    Refused: a target that is not an absolute path (``*``, the asterisk form), dot segments
    (``/v1/./completions``, ``/v1/x/../completions``, ``/v1/completions/.``), empty segments
    (``//``), backslashes, and percent-encoding of any kind (``%2e``, ``%2f``, ``%63``): the
    gateway's own paths and the engine's it forwards are plain ASCII, and an engine, a proxy or
    a URL library may read any of these as another path than the gateway would.
    """
    raw = scope.get("raw_path")
    if raw is None:  # a server that gives no raw path: the decoded one, which is all there is
        raw = scope["path"].encode("utf-8", "surrogateescape")
    if not raw.startswith(b"/") or _AMBIGUOUS.search(raw):
        raise responses.ambiguous_path(raw.decode("latin-1"))
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise responses.ambiguous_path(raw.decode("latin-1")) from None


def _target(scope: Scope) -> str:
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string") or b""
    return (path + b"?" + query if query else path).decode("latin-1")


async def read_body(receive: Receive, *, limit: int, declared: bytes | None) -> bytes:
    """The whole request body; 413 past ``limit`` bytes (before reading, when declared)."""
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise bad_request("Content-Length is not a number") from None
        if size > limit:
            raise responses.body_too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise responses.body_too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body"):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
