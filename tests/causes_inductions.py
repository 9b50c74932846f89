"""Load that induces one latency cause at a time on a real vLLM engine (tests/test_causes_engine.py).

Each induction is a set of closed-loop client streams (distinct random prompts: no prefix-cache
sharing) run while something else happens (the diagnosis): chats beside long prompts (step
mixing), long answers on a small KV cache (preemption), many chats on few sequence slots
(queueing), clients that hang up after their first token (aborted work), and a few chats on a
roomy engine (healthy). Sizes come from the engine's own configuration (its token budget per
step, its slots, its KV blocks) and from what it was measured to do here, never from a clock.
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

from bot.canary.client import RequestRecord, stream_request
from bot.canary.workload import PROMPT_ID_RANGE
from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.vllm_metrics import RUNNING, WAITING, gauge, parse_page
from bot.engine.process import EngineInfo

T = TypeVar("T")
CHAT_PROMPT, CHAT_OUTPUT = 64, 64  # a chat: a short question, a short answer
GUARD_S = 900.0  # a wait that never ends fails, however slow the machine


@dataclass(frozen=True)
class Stream:
    """One closed-loop client: it sends the next request when the last one ends."""

    prompt: int
    output: int
    cancel_after: int | None = None  # hang up once it holds this many tokens


class Client:
    """Streaming requests to one engine, and its /metrics."""

    def __init__(self, info: EngineInfo, session: aiohttp.ClientSession, http: httpx.AsyncClient):
        self.info, self.session, self.http = info, session, http
        self.rng = random.Random(20261202)
        self.sent = 0  # requests the streams sent

    async def page(self) -> Exposition:
        response = await self.http.get(f"{self.info.base_url}/metrics")
        return parse_page(response.text, url="metrics", at=time.monotonic())

    async def config(self, name: str) -> float:
        """A number from vLLM's cache_config_info labels (``num_gpu_blocks``, ``block_size``)."""
        for line in (await self.http.get(f"{self.info.base_url}/metrics")).text.splitlines():
            if line.startswith("vllm:cache_config_info{"):
                label = line.split(f'{name}="', 1)[1].split('"', 1)[0]
                return float(label)
        raise AssertionError("the engine exports no vllm:cache_config_info")

    async def max_model_len(self) -> int:
        models = (await self.http.get(f"{self.info.base_url}/v1/models")).json()
        return int(models["data"][0]["max_model_len"])

    async def idle(self) -> None:
        """Wait until no request of an earlier induction is running or waiting."""
        deadline = time.monotonic() + GUARD_S
        while time.monotonic() < deadline:
            page = await self.page()
            if (gauge(page, RUNNING) or 0) + (gauge(page, WAITING) or 0) == 0:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"the engine was still busy after {GUARD_S:g} s")

    async def request(
        self, stream: Stream, on_first_token: Callable[[], None] | None = None
    ) -> RequestRecord:
        """One streaming completion of ``stream``'s shape, with a distinct random prompt."""
        body = {
            "model": self.info.model,
            "prompt": self.rng.choices(range(*PROMPT_ID_RANGE), k=stream.prompt),
            "max_tokens": stream.output,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        record = RequestRecord(sent_at=time.perf_counter())
        url = f"{self.info.base_url}/v1/completions"
        await stream_request(
            self.session, url, body, record, cancel_after_tokens=stream.cancel_after,
            timeout_s=GUARD_S, on_first_token=on_first_token,
        )  # fmt: skip
        assert record.error is None, record
        return record

    async def alone_s(self, stream: Stream, times: int = 2) -> float:
        """Seconds one request of this shape takes with nothing else running (the least of)."""
        await self.idle()
        seconds = []
        for _ in range(times):
            record = await self.request(stream)
            assert record.e2e_s is not None, record
            seconds.append(record.e2e_s)
        return min(seconds)

    async def loop(self, stream: Stream, stop: asyncio.Event, warm: asyncio.Event) -> None:
        """Requests of ``stream``'s shape one after another until ``stop``; ``warm`` is set
        at the first one's first token (its prompt was prefilled: the load is on)."""
        while not stop.is_set():
            self.sent += 1
            await self.request(stream, on_first_token=warm.set)

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
            await asyncio.wait_for(asyncio.gather(*(w.wait() for w in warm)), GUARD_S)
            result = await during()
        finally:
            stop.set()
            for task in tasks:
                task.cancel()  # an unfinished request hangs up: the engine aborts it
            await asyncio.gather(*tasks, return_exceptions=True)
        return result, self.sent - sent


@dataclass(frozen=True)
class Measured:
    """What one engine was measured to do here, and what its configuration allows."""

    chat_s: float  # one chat alone, first byte to last token
    max_model_len: int
    kv_tokens: int  # tokens its KV cache holds (vLLM keeps one block aside)
    long_prompt: int  # the longest prompt one scheduler step prefills whole, beside two chats
    long_s: float | None  # that prompt alone (one output token); None when not measured

    @property
    def step_s(self) -> float:
        """At least one decode step (a chat alone, prefill included, over its tokens)."""
        return self.chat_s / CHAT_OUTPUT


async def measure(client: Client, *, step_budget: int, long: bool) -> Measured:
    """Time a chat alone (and, with ``long``, the longest prompt one step takes whole)."""
    blocks = await client.config("num_gpu_blocks")
    block = await client.config("block_size")
    long_prompt = step_budget - 2 * (CHAT_PROMPT + 1) - 64  # room for two chats' steps
    return Measured(
        chat_s=await client.alone_s(Stream(CHAT_PROMPT, CHAT_OUTPUT)),
        max_model_len=await client.max_model_len(),
        kv_tokens=int((blocks - 1) * block),
        long_prompt=long_prompt,
        long_s=await client.alone_s(Stream(long_prompt, 1)) if long else None,
    )


@dataclass(frozen=True)
class Plan:
    """An induction's streams and the diagnosis window that sees it."""

    streams: list[Stream]
    window_s: float


CHAT = Stream(CHAT_PROMPT, CHAT_OUTPUT)
# A window as long as this many chats alone: tens of requests end in it under every load below.
WINDOW_CHATS = 30
ABANDON_PROMPT = 256  # three such prompts stay within a 2,048-token step


def chats_window(m: Measured) -> float:
    return WINDOW_CHATS * m.chat_s


def healthy(m: Measured) -> Plan:
    """Two chats at a time on four slots: half the engine's slots, no queue, tiny steps."""
    return Plan([CHAT, CHAT], chats_window(m))


def mixing(m: Measured) -> Plan:
    """Two chats decoding while a client sends prompts as long as one step takes whole: each is
    prefilled in one step beside the chats' decode. The window holds at least four of them."""
    assert m.long_s is not None, "measure the long prompt first"
    return Plan([CHAT, CHAT, Stream(m.long_prompt, 8)], max(chats_window(m), 4 * m.long_s))


def queueing(m: Measured, seqs: int) -> Plan:
    """Four chats per sequence slot: three of every four wait in the queue."""
    return Plan([CHAT] * (4 * seqs), chats_window(m))


def abandoned(m: Measured) -> Plan:
    """Two clients that hang up at their first token (the engine prefilled their prompt for
    nothing), beside one that stays for its answer. One prompt length for all: the probe
    splits the tokens in flight into prompt and output by the prompts that ended."""
    leaving = Stream(ABANDON_PROMPT, CHAT_OUTPUT, cancel_after=1)
    staying = Stream(ABANDON_PROMPT, CHAT_OUTPUT)
    return Plan([leaving, leaving, staying], chats_window(m))


def kv_pressure(m: Measured, seqs: int) -> Plan:
    """One request per slot, together twice what the KV cache holds: the engine preempts one
    to grow another, and resumes it (recomputing its prefill) when one ends. A preemption is
    counted only when its request resumes, so the window lasts four rounds of the slots'
    answers (a decode step is at most ``step_s``)."""
    answer = 2 * m.kv_tokens // seqs - CHAT_PROMPT
    assert 0 < answer <= m.max_model_len - CHAT_PROMPT, f"no answer fits: {m}"
    window_s = max(chats_window(m), 4 * seqs * answer * m.step_s)
    return Plan([Stream(CHAT_PROMPT, answer)] * seqs, window_s)
