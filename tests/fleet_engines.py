"""Two real vLLM engines behind a real nginx round-robin, for the fleet's engine tests
(tests/test_fleet_engine.py, tests/test_canary_live_engine.py): the engines and nginx as
module fixtures, clients that time their own tokens, and the cgroup CPU quota that makes one
engine's core (not its API server) slow by a factor sized from the speeds measured here.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import psutil
import pytest

from bot.canary.client import RequestRecord, stream_request
from bot.engine.cpu_limit import MIN_CORES, CpuLimit
from bot.engine.process import EngineInfo, EngineManager, free_port
from bot.eval.fleet import router

PROMPT, OUTPUT = 48, 24  # tokens per request (one byte is one token)
# requests through nginx, clients at once: small, the box has 2 cores; round-robin gives each
# replica 24, over the replica rule's 20
LOAD, CONCURRENCY = 48, 4
SLOWDOWN = 8.0  # the sick replica decodes at least this many times slower than the healthy one


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[EngineInfo]]:
    """Two engines, started side by side (each manager its own state and model directory)."""
    managers = [EngineManager(state_dir=tmp_path_factory.mktemp(f"fleet-{i}")) for i in (0, 1)]
    ports = [free_port(), free_port()]
    while ports[1] == ports[0]:
        ports[1] = free_port()
    try:
        with ThreadPoolExecutor(2) as pool:
            futures = [
                pool.submit(m.start, port=p, flags=["--enforce-eager"], timeout_s=600)
                for m, p in zip(managers, ports, strict=True)
            ]
            yield [f.result() for f in futures]
    finally:
        for manager, port in zip(managers, ports, strict=True):
            manager.stop(port)
        for port in ports:
            sick_limit(port).remove()  # once its processes are gone


def sick_limit(port: int, cores: float = 1.0) -> CpuLimit:
    """The cgroup that holds the sick engine's processes."""
    return CpuLimit(cores=max(cores, MIN_CORES), name=f"ruleloop-fleet-sick-{port}")


@pytest.fixture(scope="module")
def nginx(engines: list[EngineInfo], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Debian's nginx, round-robin over the two engines, on loopback; its base URL."""
    with router([e.port for e in engines], tmp=tmp_path_factory.mktemp("nginx")) as url:
        yield url


async def request(session: aiohttp.ClientSession, base_url: str, n: int) -> RequestRecord:
    """One streaming completion with a distinct prompt (no prefix-cache sharing)."""
    prompt = [100 + (n * 7 + i) % 150 for i in range(PROMPT)]
    body = {
        "model": "tiny-llama",
        "prompt": prompt,
        "max_tokens": OUTPUT,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    record = RequestRecord(sent_at=time.perf_counter())
    await stream_request(session, f"{base_url}/v1/completions", body, record, timeout_s=600)
    assert record.error is None and record.output_tokens == OUTPUT, record
    return record


async def alone(session: aiohttp.ClientSession, base_url: str) -> tuple[float, float]:
    """Decode seconds per token and seconds per request, one request at a time (median of 2)."""
    records = [await request(session, base_url, 10_000 + i) for i in range(2)]
    decode = [
        (r.last_token_at - r.first_token_at) / (OUTPUT - 1)
        for r in records
        if r.last_token_at is not None and r.first_token_at is not None
    ]
    e2e = [r.e2e_s for r in records if r.e2e_s is not None]
    return statistics.median(decode), statistics.median(e2e)


def hold(limit: CpuLimit, engine: EngineInfo) -> None:
    """Put the engine's core (the process the model runs in) under ``limit``'s quota: a slow
    GPU. Its API server keeps its CPU, as a GPU's host does, so a client gets a token when the
    engine has it; a starved server would deliver tokens late, a delay no engine counts."""
    children = psutil.Process(engine.pid).children(recursive=True)
    assert children, "the engine runs no engine core process"
    for proc in children:
        limit.apply(proc.pid)


async def make_sick(
    session: aiohttp.ClientSession, engines: list[EngineInfo], slowdown: float = SLOWDOWN
) -> dict[str, float]:
    """Slow the second engine until it decodes ``slowdown`` x slower than the first, sizing the
    quota from the measured speeds; what was measured."""
    healthy, _ = await alone(session, engines[0].base_url)
    sick, _ = await alone(session, engines[1].base_url)
    cores = 1.0 / slowdown  # an engine decoding alone keeps about one core busy
    for _ in range(4):
        hold(sick_limit(engines[1].port, cores), engines[1])
        sick, sick_e2e = await alone(session, engines[1].base_url)
        if sick >= slowdown * healthy:
            break
        cores *= sick / (slowdown * healthy) / 1.2  # slower by what is still missing
    assert sick >= slowdown * healthy, f"could not slow the engine: {sick=:.4f} {healthy=:.4f}"
    return {
        "healthy_decode_s": healthy, "sick_decode_s": sick, "sick_e2e_s": sick_e2e,
        "sick_cores": max(cores, MIN_CORES),
    }  # fmt: skip


@contextlib.contextmanager
def one_cpu(engines: Sequence[EngineInfo]) -> Iterator[int]:
    """Every thread of every process of ``engines`` (API servers and cores) on one CPU, the
    last this process may use; put back on all of them at the end; the CPU. Two engines on one
    run queue share it fairly, whatever else the box runs: "alike" by construction. Left free,
    a third busy process on a 2-core box leaves one engine a core of its own and the other half
    a core, for minutes; pinning the cores alone left the API servers as unequal."""
    allowed = os.sched_getaffinity(0)
    cpu = max(allowed)

    def place(cpus: set[int]) -> None:
        for engine in engines:
            root = psutil.Process(engine.pid)
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    for thread in proc.threads():
                        with contextlib.suppress(ProcessLookupError):  # a thread that ended
                            os.sched_setaffinity(thread.id, cpus)

    place({cpu})
    try:
        yield cpu
    finally:
        place(allowed)


def p99(values: list[float]) -> float:
    """The clients' p99 (nearest rank)."""
    ordered = sorted(values)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]


async def load(
    session: aiohttp.ClientSession,
    base_url: str,
    count: int = LOAD,
    concurrency: int = CONCURRENCY,
) -> list[RequestRecord]:
    """``count`` requests through nginx, ``concurrency`` at a time."""
    queue = list(range(count))
    records: list[RequestRecord] = []

    async def client() -> None:
        while queue:
            records.append(await request(session, base_url, queue.pop()))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return records
