"""One streaming request to an OpenAI-compatible endpoint, timed chunk by chunk.

The record is updated while the stream runs, so the sampler can see how many tokens each
in-flight request holds at the moment it scrapes the engine.

This is the canary's hot path, so it runs on aiohttp: its C HTTP parser costs about half the
client CPU per streamed token of httpx's pure-Python stack (0.14 vs 0.30 ms/token measured
here), which matters when the client shares a 2-core box with the engine it measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import aiohttp
import msgspec

from bot.kernel.runtime import DONE, SSEParser


class Outcome(StrEnum):
    """How a request ended, as the client saw it."""

    OK = "ok"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass
class RequestRecord:
    """Timings and token counts of one request (monotonic seconds)."""

    sent_at: float
    prompt_tokens: int | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    output_tokens: int = 0
    itl_s: list[float] = field(default_factory=list)
    outcome: Outcome | None = None
    error: str | None = None
    cause: str | None = None  # why it failed, for counting: 'HTTP 429', 'timeout', 'transport'
    planned_prompt_tokens: int = 0
    finish_reason: str | None = None  # the server's, once a chunk says the answer is complete

    @property
    def ttft_s(self) -> float | None:
        """Request sent -> first chunk carrying a token."""
        return None if self.first_token_at is None else self.first_token_at - self.sent_at

    @property
    def e2e_s(self) -> float | None:
        """Request sent -> end of stream."""
        return None if self.finished_at is None else self.finished_at - self.sent_at

    @property
    def tpot_s(self) -> float | None:
        """(e2e - TTFT) / (output tokens - 1); None for requests with one token or fewer."""
        ttft, e2e = self.ttft_s, self.e2e_s
        if ttft is None or e2e is None or self.output_tokens <= 1:
            return None
        return (e2e - ttft) / (self.output_tokens - 1)

    @property
    def in_flight(self) -> bool:
        """Still streaming."""
        return self.outcome is None


BODY_END_S = 1.0  # how long a server may take to end its body after the stream's end


class StreamError(Exception):
    """The server ended the stream with an error event."""


async def stream_tokens(
    session: aiohttp.ClientSession,
    url: str,
    *,
    model: str,
    prompt: list[int],
    max_tokens: int,
    cancel_after_tokens: int | None = None,
    timeout_s: float | None = None,
    on_first_token: Callable[[], None] | None = None,
) -> RequestRecord:
    """One streaming completion of ``prompt`` (token ids) for exactly ``max_tokens`` tokens
    (greedy, ``ignore_eos``), timed; its record (``error`` set when it failed)."""
    body = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
        "temperature": 0.0, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }  # fmt: skip
    record = RequestRecord(sent_at=time.perf_counter())
    await stream_request(session, url, body, record, cancel_after_tokens=cancel_after_tokens,
                         timeout_s=timeout_s, on_first_token=on_first_token)  # fmt: skip
    return record


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any] | bytes,
    record: RequestRecord,
    *,
    headers: dict[str, str] | None = None,
    abandon_after_s: float | None = None,
    cancel_after_tokens: int | None = None,
    timeout_s: float | None = None,
    on_first_token: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """Send one streaming request, filling ``record`` as chunks arrive.

    With ``abandon_after_s`` the client gives up after that long, with ``cancel_after_tokens``
    once it holds that many output tokens; either way it closes the connection the way an
    impatient user's browser would, and the request ends as cancelled. ``timeout_s`` bounds the
    whole request (one timer per request: cheaper than httpx's per-read timeouts).
    ``on_first_token`` is called once, when the first token arrives.
    """
    limit = abandon_after_s if abandon_after_s is not None else timeout_s
    try:
        async with asyncio.timeout(limit):
            async with _post(session, url, body, headers) as response:
                if response.status != 200:
                    await _refused(response, record, clock)
                    return
                gave_up = await _read_events(
                    response, record, clock, cancel_after_tokens, on_first_token
                )
                ended_at = clock()
                if gave_up:
                    # Hang up mid-stream, as a closed browser tab does: the server sees the
                    # disconnect and aborts the request.
                    response.close()
                else:
                    await _read_to_the_end(response)
        record.finished_at = ended_at
        record.outcome = Outcome.CANCELLED if gave_up else Outcome.OK
    except TimeoutError:
        if abandon_after_s is not None:
            record.finished_at = clock()
            record.outcome = Outcome.CANCELLED
        else:
            _failed(record, clock(), f"no complete response within {timeout_s:g} s", "timeout")
    except StreamError as exc:
        _failed(record, clock(), str(exc), "stream error")
    except aiohttp.ClientError as exc:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        _failed(record, clock(), error, "transport")


def _post(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any] | bytes,
    headers: dict[str, str] | None,
) -> contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]:
    """The POST of a request body: a ready-encoded one says it is JSON, a dict is encoded."""
    if isinstance(body, bytes):
        headers = {"Content-Type": "application/json", **(headers or {})}
        return session.post(url, data=body, headers=headers)
    return session.post(url, json=body, headers=headers)


async def _refused(
    response: aiohttp.ClientResponse, record: RequestRecord, clock: Callable[[], float]
) -> None:
    """A request the server answered with an error status: failed, with the error's message."""
    detail = (await response.read()).decode(errors="replace")[:300]
    _failed(
        record, clock(), f"HTTP {response.status}: {_error_message(detail)}",
        f"HTTP {response.status}",
    )  # fmt: skip


def _failed(record: RequestRecord, now: float, error: str, cause: str) -> None:
    """End ``record`` as failed at ``now``: the error to show, the cause to count it under."""
    record.finished_at = now
    record.outcome = Outcome.FAILED
    record.error = error
    record.cause = cause


async def _read_to_the_end(response: aiohttp.ClientResponse) -> None:
    """Read what follows the stream's end, so the connection goes back to the pool. vLLM ends
    its HTTP body in a write after `[DONE]`; a client that stopped reading at `[DONE]` dropped
    the connection, and the next request paid for a new one: about a third of the requests
    straight to vLLM, none through the gateway (which ends both in one write), so the two paths
    were not measured alike. The request was complete at `[DONE]` (its time is taken there)."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with asyncio.timeout(BODY_END_S):
            await response.content.read()


async def _read_events(
    response: aiohttp.ClientResponse,
    record: RequestRecord,
    clock: Callable[[], float],
    cancel_after_tokens: int | None,
    on_first_token: Callable[[], None] | None,
) -> bool:
    """Read the stream into ``record``; return True when the client gave up before its end."""
    parser = SSEParser()  # any framing the spec allows: LF, CRLF or CR (docs/canary.md)
    readany = response.content.readany  # b"" at the end; one layer less than iter_any's
    while read := await readany():
        for data in parser.feed_data(read):
            ended = _on_event(data, record, clock(), cancel_after_tokens, on_first_token)
            if ended is not None:
                return ended
    for event in parser.end():  # a last event the server left without its blank line
        ended = _on_event(event.data, record, clock(), cancel_after_tokens, on_first_token)
        if ended is not None:
            return ended
    return False


def _on_event(
    data: bytes | str,
    record: RequestRecord,
    now: float,
    cancel_after_tokens: int | None,
    on_first_token: Callable[[], None] | None,
) -> bool | None:
    """Account for one event: None to read on, False at the stream's end, True to give up."""
    had_token = record.first_token_at is not None
    if _handle_event(data, record, now):
        return False
    if on_first_token and not had_token and record.first_token_at is not None:
        on_first_token()
    # Checked per event, not per read: one read may carry more tokens than the client was
    # willing to wait for, and those must not count as received. An answer that is complete
    # (vLLM may pack the last tokens into one chunk) was not given up on.
    if (
        cancel_after_tokens is not None
        and record.output_tokens >= cancel_after_tokens
        and record.finish_reason is None
    ):
        return True
    return None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


# A token's text is never read, only whether it is there: kept as raw JSON (b'"..."', b'null',
# or b'' when absent), msgspec neither unescapes nor copies it. The test model's tokens stream
# as 1-2 kB of text each, so this is most of a chunk's decoding.
_ABSENT = msgspec.Raw()
_NULL = b"null"
_EMPTY = b'""'


class _Delta(msgspec.Struct):
    content: msgspec.Raw = _ABSENT
    role: str | None = None


class _Choice(msgspec.Struct):
    text: msgspec.Raw = _ABSENT
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Chunk(msgspec.Struct):
    """The fields of a streamed chunk the canary reads; msgspec skips the rest unparsed."""

    choices: list[_Choice] = msgspec.field(default_factory=list)
    usage: _Usage | None = None
    error: msgspec.Raw | None = None


# One chunk per token on the hot path: a typed decoder costs about a tenth of json.loads here.
_decode_chunk = msgspec.json.Decoder(_Chunk).decode


_DONE = DONE.encode()


def _handle_event(data: bytes | str, record: RequestRecord, now: float) -> bool:
    """Account for one SSE event's data (UTF-8 bytes as read, or text); return True at the end
    of the stream."""
    payload = data.strip()
    if payload in (_DONE, DONE):
        return True
    try:
        chunk = _decode_chunk(payload)
    except msgspec.DecodeError as exc:
        if isinstance(payload, bytes):  # not UTF-8: read it as the SSE spec decodes it
            return _handle_event(payload.decode("utf-8", "replace"), record, now)
        raise StreamError(
            f"the stream carried an event that is not a completion chunk: {payload[:80]!r}"
        ) from exc
    if chunk.error is not None:
        text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
        raise StreamError(_error_message(text))
    _count_tokens(chunk, record, now)
    return False


def _count_tokens(chunk: _Chunk, record: RequestRecord, now: float) -> None:
    """Count the tokens a chunk brings: one per chunk that carries a token while the stream
    runs, the server's exact total from the usage at its end. The canary asks for usage once
    (what production clients send): usage on every chunk made vLLM's API server build it for
    every token, on the cores the engine runs on (docs/canary.md). Straight-line code, no
    generators: it runs once per streamed token, on the cores the engine needs."""
    choices = chunk.choices
    carries = False
    for choice in choices:
        if choice.finish_reason:
            record.finish_reason = choice.finish_reason
        carries = carries or _carries_token(choice)
    usage = chunk.usage
    if usage is not None and usage.prompt_tokens is not None:
        record.prompt_tokens = usage.prompt_tokens
    count = record.output_tokens
    if usage is not None and usage.completion_tokens is not None:
        total = usage.completion_tokens  # exact: the final chunk (or usage on every chunk)
    else:
        # A lower bound: a server that falls behind packs several tokens into one chunk.
        total = count + 1 if carries else count
    if total <= count:
        return
    if choices:
        if record.first_token_at is None:
            record.first_token_at = now
        elif record.last_token_at is not None:
            record.itl_s.append(now - record.last_token_at)
        record.last_token_at = now
    record.output_tokens = total


def _carries_token(choice: _Choice) -> bool:
    """Whether a chunk's choice carries a token, as vLLM streams them: every chunk after the
    first does, with empty text too (a token that ends inside a UTF-8 character; `vllm bench
    serve` counts those alike). Not a token: a chunk that only says why the answer ended, or a
    chat stream's first chunk, which names the role."""
    text = bytes(choice.text)  # raw JSON: b'' absent, b'null', else a string
    if text and text != _NULL:
        # /v1/completions sends a chunk only for tokens, the last one with its finish reason
        # (a 1-token answer whose text is empty is one chunk: empty text, finish reason)
        return True
    delta = choice.delta
    if delta is None or delta.role is not None:
        return False
    content = bytes(delta.content)
    if not content or content == _NULL:
        return False
    return content != _EMPTY or choice.finish_reason is None


def _error_message(text: str) -> str:
    """The message of an OpenAI-shaped error body, else the text itself."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)
