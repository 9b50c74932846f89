"""The gateway bench's requests and how a round sends them.

For bench/gateway_bench.py, bench/gateway_lone_stream_check.py and bench/gateway_trace.py:
``bodies`` (chat requests with distinct random prompts), ``drive`` (send them with a number of
streams in flight, on a session's kept-alive connections or a new one's) and ``new_session``.
Its own module so that the bench and its single-stream check do not import each other.
"""

from __future__ import annotations

import asyncio
import random
import string
import time

import _gateway_bench_wave as wave
import aiohttp

from bot.canary.client import RequestRecord, stream_request

USAGE = {"include_usage": True, "continuous_usage_stats": True}


def bodies(count: int, words: int, output: int, seed: int) -> list[dict[str, object]]:
    """Chat requests with distinct random prompts (no prefix-cache hits across runs)."""
    rng = random.Random(seed)

    def prompt() -> str:
        return " ".join(rng.choice(string.ascii_lowercase) for _ in range(words))

    return [
        {"model": "tiny-llama", "max_tokens": output, "ignore_eos": True, "temperature": 0.0,
         "stream": True, "stream_options": USAGE,
         "messages": [{"role": "user", "content": prompt()}]}
        for _ in range(count)
    ]  # fmt: skip


async def drive(
    url: str,
    requests: list[dict[str, object]],
    concurrency: int,
    *,
    session: aiohttp.ClientSession | None = None,
    arrivals: wave.Arrivals | None = None,
    to_end: bool = False,
) -> tuple[list[RequestRecord], float]:
    """Send every request with ``concurrency`` streams in flight; return records and wall time.

    With ``session`` the requests go on that session's connections (opened before, when it was
    warmed); without, on a new session that opens its own. With ``arrivals`` each request's
    head is stamped as it goes out (request ``i`` carries ``x-trace-id: i``). With ``to_end``
    each response is read to its end (``wave.stream_to_end``), so no connection is dropped.
    """
    if session is None:
        async with new_session(concurrency, arrivals) as own:
            return await drive(
                url, requests, concurrency, session=own, arrivals=arrivals, to_end=to_end
            )
    records: list[RequestRecord] = []
    queue = list(reversed(requests))

    async def worker() -> None:
        while queue:
            seq = len(records)
            record = RequestRecord(sent_at=time.perf_counter())
            records.append(record)
            headers = {"x-trace-id": str(seq)} if arrivals is not None else None
            send = wave.stream_to_end if to_end else stream_request
            await send(session, url, queue.pop(), record, headers=headers, timeout_s=600)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records, time.perf_counter() - started


def new_session(concurrency: int, arrivals: wave.Arrivals | None = None) -> aiohttp.ClientSession:
    """A client session with room for ``concurrency`` connections (kept alive between rounds)."""
    connector = aiohttp.TCPConnector(limit=concurrency + 8, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=60)
    traces = [arrivals.config] if arrivals is not None else []
    return aiohttp.ClientSession(connector=connector, timeout=timeout, trace_configs=traces)
