"""Closed-loop client streams on a real vLLM engine, sized from what the engine was measured to do.

A scenario's load (bot/eval/scenario.py) is a set of streams: each one client that sends its next
request when the last one ends, with its own random prompt (no prefix-cache sharing) and a fixed
answer length (``ignore_eos``), optionally hanging up after its first tokens. The load runs while
the diagnosis runs; the diagnosis starts once every stream holds its first token. Sizes come from
the engine's configuration (its step budget, slots and KV blocks) and from what it was measured
to do here (a chat alone, the longest whole-step prompt alone), never from a clock.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
import httpx

from bot.canary import PROMPT_ID_RANGE, RequestRecord, stream_tokens
from bot.diagnosis.probes import RUNNING, WAITING, gauge, parse_page
from bot.engine import EngineInfo
from bot.kernel import RuleloopError

T = TypeVar("T")
CHAT_PROMPT, CHAT_OUTPUT = 64, 64  # a chat: a short question, a short answer
GUARD_S = 900.0  # a wait that never ends fails, however slow the machine
SHARED_MAX = 32768  # the longest shared prefix a stream may open with


class LoadFailed(RuleloopError):
    """The engine did not serve the load (an error answer, or busy past the guard)."""


class Refused(LoadFailed):
    """The engine refused a request at admission: its queue is full (vLLM's queued-request
    limits). A streaming request is refused with an error event in an HTTP 200 stream."""


def refused(record: RequestRecord) -> bool:
    """Whether the engine refused the request at admission (HTTP 503, or an error event that
    says the engine is busy and accepts no new requests)."""
    error = record.error or ""
    return error.startswith("HTTP 503") or "currently busy and cannot accept new" in error


@dataclass(frozen=True)
class Stream:
    """One closed-loop client: it sends the next request when the last one ends."""

    prompt: int
    output: int
    cancel_after: int | None = None  # hang up once it holds this many tokens
    prefix: int = 0  # tokens every prompt of the run opens with (the prefix cache can serve them)


@dataclass(frozen=True)
class Measured:
    """What one engine was measured to do here, and what its configuration allows."""

    chat_s: float  # one chat alone, first byte to last token
    max_model_len: int
    kv_tokens: int  # tokens its KV cache holds (vLLM keeps one block aside)
    step_prompt: int  # the longest prompt one scheduler step prefills whole, beside two chats
    step_prompt_s: float | None  # that prompt alone (one output token); None: not measured

    @property
    def step_s(self) -> float:
        """At least one decode step (a chat alone, prefill included, over its tokens)."""
        return self.chat_s / CHAT_OUTPUT


class Client:
    """Streaming requests to one engine or a fleet's router, and the engines' /metrics."""

    def __init__(self, url: str, engines: list[EngineInfo], session: aiohttp.ClientSession,
                 http: httpx.AsyncClient):  # fmt: skip
        self.url, self.engines, self.session, self.http = url, engines, session, http
        self.model = engines[0].model
        self.rng = random.Random(20261202)
        self.shared = self.rng.choices(range(*PROMPT_ID_RANGE), k=SHARED_MAX)  # one "system prompt"
        self.sent = 0  # requests the streams sent
        self.refused = 0  # of them, refused at admission (HTTP 503: the engine's queue is full)

    async def _metrics(self, url: str | None = None) -> str:
        return (await self.http.get(f"{url or self.engines[0].base_url}/metrics")).text

    async def config(self, name: str) -> float:
        """A number from vLLM's cache_config_info labels (``num_gpu_blocks``, ``block_size``)."""
        for line in (await self._metrics()).splitlines():
            if line.startswith("vllm:cache_config_info{") and f'{name}="' in line:
                return float(line.split(f'{name}="', 1)[1].split('"', 1)[0])
        raise LoadFailed(f"the engine at {self.engines[0].base_url} exports no {name} in "
                         "vllm:cache_config_info: is it a vLLM engine?")  # fmt: skip

    async def max_model_len(self) -> int:
        models = (await self.http.get(f"{self.engines[0].base_url}/v1/models")).json()
        return int(models["data"][0]["max_model_len"])

    async def idle(self) -> None:
        """Wait until no request of an earlier load is running or waiting on any engine."""
        deadline = time.monotonic() + GUARD_S
        while time.monotonic() < deadline:
            busy = 0.0
            for engine in self.engines:
                page = parse_page(await self._metrics(engine.base_url), url="metrics",
                                  at=time.monotonic())  # fmt: skip
                busy += (gauge(page, RUNNING) or 0) + (gauge(page, WAITING) or 0)
            if busy == 0:
                return
            await asyncio.sleep(0.1)
        raise LoadFailed(f"the engine was still busy after {GUARD_S:g} s")

    async def request(
        self, stream: Stream, on_first_token: Callable[[], None] | None = None
    ) -> RequestRecord:
        """One streaming completion of ``stream``'s shape, with a distinct random prompt."""
        record = await stream_tokens(
            self.session, f"{self.url}/v1/completions", model=self.model,
            prompt=self.shared[: stream.prefix]
            + self.rng.choices(range(*PROMPT_ID_RANGE), k=stream.prompt - stream.prefix),
            max_tokens=stream.output, cancel_after_tokens=stream.cancel_after, timeout_s=GUARD_S,
            on_first_token=on_first_token,
        )  # fmt: skip
        if refused(record):
            raise Refused(record.error or "refused")
        if record.error is not None:
            raise LoadFailed(f"a {stream.prompt}-token request failed: {record.error}")
        return record

    async def alone_s(self, stream: Stream, times: int = 2) -> float:
        """Seconds one request of this shape takes with nothing else running (the least of)."""
        await self.idle()
        seconds = []
        for _ in range(times):
            record = await self.request(stream)
            if record.e2e_s is None:
                raise LoadFailed(f"a {stream.prompt}-token request ended without its answer")
            seconds.append(record.e2e_s)
        return min(seconds)

    async def loop(self, stream: Stream, stop: asyncio.Event, warm: asyncio.Event) -> None:
        """Requests of ``stream``'s shape one after another until ``stop``; ``warm`` is set
        at the first one's first token (its prompt was prefilled: the load is on), or at its
        first refusal (the engine's queue is full: the load is on too). A refused client
        tries again after a pause of one chat's decode step."""
        while not stop.is_set():
            self.sent += 1
            try:
                await self.request(stream, on_first_token=warm.set)
            except Refused:
                self.refused += 1
                warm.set()
                await asyncio.sleep(0.02)

    async def under(
        self, streams: list[Stream], during: Callable[[], Awaitable[T]]
    ) -> tuple[T, int]:
        """Run ``during`` while ``streams`` load the engine (each past its first token);
        its result and the requests the streams sent."""
        await self.idle()
        sent, stop = self.sent, asyncio.Event()
        warm = [asyncio.Event() for _ in streams]
        tasks = [
            asyncio.create_task(self.loop(s, stop, w)) for s, w in zip(streams, warm, strict=True)
        ]
        try:
            await _warm(warm, tasks)
            result = await during()
        finally:
            stop.set()
            for task in tasks:
                task.cancel()  # an unfinished request hangs up: the engine aborts it
            await asyncio.gather(*tasks, return_exceptions=True)
        return result, self.sent - sent


async def measure(client: Client, *, step_budget: int, step_prompt: bool) -> Measured:
    """Time a chat alone (and, with ``step_prompt``, the longest prompt one step takes whole
    beside two chats: the step budget less room for the chats' steps)."""
    blocks = await client.config("num_gpu_blocks")
    block = await client.config("block_size")
    longest = step_budget - 2 * (CHAT_PROMPT + 1) - 64
    return Measured(
        chat_s=await client.alone_s(Stream(CHAT_PROMPT, CHAT_OUTPUT)),
        max_model_len=await client.max_model_len(),
        kv_tokens=int((blocks - 1) * block),
        step_prompt=longest,
        step_prompt_s=await client.alone_s(Stream(longest, 1)) if step_prompt else None,
    )


async def _warm(warm: list[asyncio.Event], tasks: list[asyncio.Task[None]]) -> None:
    """Wait until every stream is warm; a stream that failed first raises its failure."""

    async def all_warm() -> None:
        await asyncio.gather(*(w.wait() for w in warm))

    everyone = asyncio.create_task(all_warm())
    try:
        done, _ = await asyncio.wait([everyone, *tasks], timeout=GUARD_S,
                                     return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        for task in tasks:
            if task in done:
                task.result()  # a stream ended before the load was on: its error
        if everyone not in done:
            raise LoadFailed(f"the load's clients had no first token after {GUARD_S:g} s")
    finally:
        everyone.cancel()
