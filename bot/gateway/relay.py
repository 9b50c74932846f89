"""One proxied exchange with the engine: send upstream, stream back, enforce deadline and cancel.

The whole exchange runs inside one ``asyncio.timeout``: the request's deadline, which a watcher
of the client connection pulls in to "now" when the client goes away. Either way the task is
cancelled at whatever it awaits, leaving the upstream response closes its connection, and vLLM
aborts the request. The hot loop does no JSON parsing: tokens are read from the last
``"completion_tokens":`` of each chunk when the client asked for usage, else counted as choice
events (``"index":``, minus chat's role-only first event). Where events end, and the end
marker, come from ``bot.kernel.runtime.sse``, the canary's parser: any framing the SSE spec allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httpx

from bot.gateway import responses
from bot.gateway.metrics import RelayOutcome
from bot.gateway.types import Headers, Message, Receive, Send
from bot.kernel.runtime import DONE, SSEParser

USAGE_KEY = b'"completion_tokens":'
PROMPT_KEY = b'"prompt_tokens":'  # read once, from the first chunk that carries usage
END_GRACE_S = 5.0  # how long the engine's body may go on after the end marker (read, not sent)
CHOICE_KEY = b'"index":'
_NUMBER = re.compile(rb"\s*(\d+)")
HOP_BY_HOP = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te",
     b"trailer", b"upgrade", b"host", b"content-length", b"expect", b"x-request-timeout")
)  # fmt: skip
BODY_METHODS = frozenset(("POST", "PUT", "PATCH"))  # they say Content-Length: 0 when empty
URL_CACHE = 256  # parsed upstream URLs kept (the inference paths, the common passthroughs)
RESPONSE_DROP = frozenset(
    (b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"date", b"server")
)  # fmt: skip


class Unreachable(Exception):
    """The upstream refused the connection: nothing was sent, so another may take the request
    (raised only where the caller asked, ``fail_over``)."""


@dataclass(slots=True)
class Exchange:
    """What happened in one exchange: how it ended, when bytes flowed, how many tokens."""

    outcome: RelayOutcome = RelayOutcome.CLIENT_CANCEL
    status: int | None = None
    first_byte_s: float | None = None
    last_byte_s: float | None = None
    counted_tokens: int = 0
    usage_tokens: int | None = None
    prompt_tokens: int | None = None  # the engine's usage.prompt_tokens, when it said
    role_events: int = 0
    head_sent: bool = False
    done: bool = False
    ended: bool = False  # the stream's end marker reached the client
    client_gone: bool = False

    @property
    def output_tokens(self) -> int:
        """Tokens the engine streamed to us (exact when the stream carried usage)."""
        if self.usage_tokens is not None:
            return self.usage_tokens
        return max(self.counted_tokens - self.role_events, 0)


def upstream_headers(headers: Headers) -> list[tuple[bytes, bytes]]:
    """The client's headers minus hop-by-hop ones and our own deadline header."""
    return [(k, v) for k, v in headers if k not in HOP_BY_HOP]


def response_headers(response: httpx.Response) -> list[tuple[bytes, bytes]]:
    """The engine's response headers minus hop-by-hop ones and those the server sets itself."""
    return [(k, v) for k, v in response.headers.raw if k.lower() not in RESPONSE_DROP]


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _ToClient:
    """The server's ``send``; an OSError from it means the client has gone.

    ASGI servers of spec 2.4 raise one (uvicorn's ``ClientDisconnected``) where older ones
    return quietly and say ``http.disconnect`` on ``receive``; the exchange ends the same way
    for both: a client_cancel, its tokens counted, the upstream response closed.
    """

    __slots__ = ("_ex", "_send")

    def __init__(self, send: Send, ex: Exchange) -> None:
        self._send, self._ex = send, ex

    async def __call__(self, message: Message) -> None:
        try:
            await self._send(message)
        except OSError:
            self._ex.client_gone = True
            raise


class _Deadline:
    """The exchange's deadline, moved by what happens around it: pulled in to now when the
    client goes away, and to at most END_GRACE_S once the client has the end marker.

    One per exchange, in place of two closures over the same three names.
    """

    __slots__ = ("_ex", "_loop", "_timeout")

    def __init__(
        self, timeout: asyncio.Timeout, loop: asyncio.AbstractEventLoop, ex: Exchange
    ) -> None:
        self._timeout, self._loop, self._ex = timeout, loop, ex

    def on_disconnect(self, task: asyncio.Task[None]) -> None:
        """The client-connection watcher's done callback."""
        ex = self._ex
        # after the end marker the client's response is complete: the server says
        # "disconnect" to every receive then, and the engine's body is drained
        if task.cancelled() or ex.done or ex.ended:
            return
        ex.client_gone = True
        # RuntimeError: the deadline is already firing; it ends the exchange anyway.
        with contextlib.suppress(RuntimeError):
            self._timeout.reschedule(self._loop.time())

    def end_grace(self) -> None:
        """What follows the end marker is only read for the connection's sake."""
        when = min(self._timeout.when() or math.inf, self._loop.time() + END_GRACE_S)
        with contextlib.suppress(RuntimeError):
            self._timeout.reschedule(when)


class Relay:
    """Runs exchanges against one upstream client (its ``base_url`` is the engine's root)."""

    def __init__(
        self, client: httpx.AsyncClient, *, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.client = client
        self.clock = clock
        self._base = str(client.base_url).rstrip("/")
        self._host = client.base_url.netloc
        self._extensions = {"timeout": client.timeout.as_dict()}
        self._urls: dict[str, httpx.URL] = {}

    async def run(
        self,
        *,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        receive: Receive,
        send: Send,
        deadline_s: float,
        stream: bool,
        role_events: int = 0,
        fail_over: bool = False,
    ) -> Exchange:
        """Proxy one request until it ends; the client always gets a complete response, except
        with ``fail_over``, where an upstream that refuses the connection raises Unreachable
        (nothing was sent to it, nor to the client)."""
        ex = Exchange(role_events=role_events)
        to_client = send
        send = _ToClient(send, ex)
        loop = asyncio.get_running_loop()
        watcher = loop.create_task(_wait_disconnect(receive))
        try:
            async with asyncio.timeout(deadline_s) as timeout:
                deadline = _Deadline(timeout, loop, ex)
                watcher.add_done_callback(deadline.on_disconnect)
                request = self._request(method, target, headers, body)
                try:
                    response = await self.client.send(request, stream=True)
                except httpx.ConnectError:
                    if fail_over:
                        raise Unreachable from None
                    raise
                try:
                    ex.status = response.status_code
                    if stream and response.status_code == 200:
                        await self._stream(response, send, to_client, ex, deadline.end_grace)
                    else:
                        payload = b"".join([c async for c in response.aiter_raw()])
                        await send(self._whole_start(response, payload, ex))
                        ex.head_sent = True
                        await send({"type": "http.response.body", "body": payload})
                finally:
                    await response.aclose()
            ex.outcome = _finished(ex)
        except TimeoutError:
            await self._timed_out(send, ex, deadline_s)
        except httpx.HTTPError as exc:
            ex.outcome = RelayOutcome.UPSTREAM_ERROR
            detail = str(exc) or type(exc).__name__
            await self._fail(send, ex, responses.upstream_broke_mid_stream(detail),
                             responses.upstream_unreachable(detail))  # fmt: skip
        except OSError:
            if not ex.client_gone:
                raise
            ex.outcome = _finished(ex) if ex.ended else RelayOutcome.CLIENT_CANCEL
        finally:
            watcher.cancel()
        return ex

    def _whole_start(self, response: httpx.Response, payload: bytes, ex: Exchange) -> Message:
        """The head of a response relayed whole (not streamed), its body read and counted: the
        exchange's bookkeeping, kept out of ``run`` and without an await of its own."""
        ex.first_byte_s = ex.last_byte_s = self.clock()
        _count(payload, ex)
        ex.done = True
        hdrs = response_headers(response)
        hdrs.append((b"content-length", str(len(payload)).encode()))
        return {"type": "http.response.start", "status": ex.status, "headers": hdrs}

    async def _timed_out(self, send: Send, ex: Exchange, deadline_s: float) -> None:
        """How an exchange the deadline cut ended, and the client told when it is still there."""
        # Fired while closing a response that was complete, or after the client had the
        # stream's end marker and left before the engine's HTTP body ended: it got it all.
        if ex.done or ex.ended:
            ex.outcome = _finished(ex)
        elif ex.client_gone:
            ex.outcome = RelayOutcome.CLIENT_CANCEL
        else:
            ex.outcome = RelayOutcome.DEADLINE
            await self._fail(send, ex, responses.deadline_mid_stream(deadline_s),
                             responses.deadline_before_output(deadline_s))  # fmt: skip

    def _request(
        self, method: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> httpx.Request:
        """The upstream request: 3 us, where httpx parsing the URL and encoding the body took 20-60.

        The URL is parsed once per target; the body goes as a ready stream, so Host and
        Content-Length are set here, as httpx would set them.
        """
        url = self._urls.get(target)
        if url is None:
            url = httpx.URL(self._base + target)
            if len(self._urls) < URL_CACHE:
                self._urls[target] = url
        headers = [(b"host", self._host), *headers]
        if body or method in BODY_METHODS:
            headers.append((b"content-length", b"%d" % len(body)))
        return httpx.Request(
            method, url, headers=headers, stream=httpx.ByteStream(body), extensions=self._extensions
        )

    async def _stream(
        self,
        response: httpx.Response,
        send: Send,
        to_client: Send,
        ex: Exchange,
        at_end: Callable[[], None],
    ) -> None:
        hdrs = response_headers(response)
        # The body as the transport hands it over: response.stream, not aiter_raw(), which adds
        # two generator layers per event and changes nothing for a body relayed undecoded.
        chunks = cast(httpx.AsyncByteStream, response.stream)
        counted = 0
        usage = None
        events = SSEParser()  # where events end, in any framing: LF, CRLF or CR
        held = b""  # the start of an event whose end has not come: never relayed half
        async for chunk in chunks:
            if ex.ended:
                continue  # past the end marker: read so the connection is reused, not relayed
            # Whole events only: a deadline or an upstream error cut between two reads must
            # not leave half an event before the gateway's own error event (a client's JSON
            # parser would choke on the pair). A read that ends mid-event is rare and its
            # start is useless to the client until the rest comes.
            found = events.feed(chunk)
            # the end marker's event ends the read that completes it (whole: never split)
            end = bool(found) and found[-1].data == DONE
            if held:
                chunk, held = held + chunk, b""
            if events.pending:
                cut = len(chunk) - events.pending
                chunk, held = chunk[:cut], chunk[cut:]
                if not chunk:
                    continue
            if not ex.head_sent:
                # Headers go out with the first event, so a deadline hit during prefill is a 504.
                ex.first_byte_s = self.clock()
                await send({"type": "http.response.start", "status": 200, "headers": hdrs})
                ex.head_sent = True
            k = chunk.rfind(USAGE_KEY)
            if k >= 0 and (m := _NUMBER.match(chunk, k + len(USAGE_KEY))) and m.end() < len(chunk):
                usage = int(m.group(1))
                if ex.prompt_tokens is None:
                    _prompt_usage(chunk, ex)
            counted += chunk.count(CHOICE_KEY)
            ex.counted_tokens = counted
            ex.usage_tokens = usage
            try:  # the hot path calls the server's send itself (one coroutine less per event)
                await to_client({"type": "http.response.body", "body": chunk, "more_body": not end})
            except OSError:
                ex.client_gone = True
                raise
            if end:  # once a stream (_marked_end: why the marker ends the last write)
                self._marked_end(ex, at_end)
        ex.done = True
        if not ex.ended:
            await self._unmarked_end(send, ex, hdrs, held)

    def _marked_end(self, ex: Exchange, at_end: Callable[[], None]) -> None:
        """The end marker reached the client: the exchange has ended, what follows is drained.

        The end marker ends the client's response in the same write. Sent after it, the body's
        end came too late for a client that stops reading at the marker (the canary, OpenAI's
        SDKs): it dropped the connection as unfinished and paid a new one on its next request,
        most requests here (docs/gateway.md).
        """
        ex.ended = True
        ex.last_byte_s = self.clock()
        at_end()

    async def _unmarked_end(
        self, send: Send, ex: Exchange, hdrs: list[tuple[bytes, bytes]], held: bytes
    ) -> None:
        """The body ended without the end marker: what it held after its last event goes as
        is (after the head, when no whole event came)."""
        ex.last_byte_s = self.clock()
        if not ex.head_sent:
            await send({"type": "http.response.start", "status": 200, "headers": hdrs})
            ex.head_sent = True
        await send({"type": "http.response.body", "body": held})

    @staticmethod
    async def _fail(send: Send, ex: Exchange, event: bytes, problem: responses.HTTPProblem) -> None:
        try:
            if ex.head_sent:
                await send({"type": "http.response.body", "body": event})
            else:
                await send_problem(send, problem)
        except OSError:
            # the client went away as well: nobody is left to tell, the first ending stands
            if not ex.client_gone:
                raise


def _finished(ex: Exchange) -> RelayOutcome:
    return (
        RelayOutcome.OK
        if ex.status is not None and ex.status < 400
        else RelayOutcome.UPSTREAM_ERROR
    )


def _count(payload: bytes, ex: Exchange) -> None:
    k = payload.rfind(USAGE_KEY)
    if k >= 0 and (m := _NUMBER.match(payload, k + len(USAGE_KEY))):
        ex.usage_tokens = int(m.group(1))
        _prompt_usage(payload, ex)
    ex.counted_tokens = payload.count(CHOICE_KEY)


def _prompt_usage(data: bytes, ex: Exchange) -> None:
    k = data.rfind(PROMPT_KEY)
    if k >= 0 and (m := _NUMBER.match(data, k + len(PROMPT_KEY))) and m.end() < len(data):
        ex.prompt_tokens = int(m.group(1))


async def send_problem(send: Send, problem: responses.HTTPProblem) -> None:
    """Answer with an OpenAI-shaped JSON error."""
    body = problem.body()
    headers = [
        *responses.JSON_HEADERS,
        (b"content-length", str(len(body)).encode()),
        *problem.headers,
    ]
    await send({"type": "http.response.start", "status": problem.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
