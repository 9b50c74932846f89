"""A target that is a fleet, on two real vLLM engines behind a real nginx round-robin.

One engine is made sick: held by a cgroup CPU quota until it decodes several times slower than
its healthy twin (the quota is sized from the speeds measured here, so a slower machine gets a
smaller quota, not a different test). Clients load the fleet through nginx and time their own
first tokens. Pointed at nginx alone, the bot must refuse to give a number (its scrapes come
from two engines); with the replicas listed, the fleet's TTFT p99 must be the clients' and the
per-replica details must show the sick one, and the replica rule must name it. Then the sick
engine is let go, and with both replicas healthy the rule must name none. Last, both are held at
the sick quota: the fleet is slow, and the rule must name no replica (a fleet-wide slowness).
"""

from __future__ import annotations

import asyncio
import math
import shutil
import socket
import statistics
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import httpx
import psutil
import pytest

from bot.canary.client import RequestRecord, stream_request
from bot.config import Target
from bot.diagnosis import replica_text, replicas
from bot.engine.cpu_limit import MAX_CORES, MIN_CORES, CpuLimit, cores_from_environment
from bot.engine.process import EngineInfo, EngineManager, free_port
from bot.errors import ProbeError
from bot.probes.context import ProbeContext, TargetRef
from bot.probes.replicas import Replica
from bot.probes.types import ProbeResult
from bot.probes.vllm_window import VllmMetricsProbe, WindowParams
from bot.runbooks.runner import RunbookResult

pytestmark = pytest.mark.engine

PROMPT, OUTPUT = 48, 24  # tokens per request (one byte is one token)
# requests through nginx, clients at once: small, the box has 2 cores; round-robin gives each
# replica 24, over the replica rule's 20
LOAD, CONCURRENCY = 48, 4
SLOWDOWN = 8.0  # the sick replica decodes at least this many times slower than the healthy one
INTERVAL_S = 0.5


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


def nginx_conf(tmp: Path, port: int, engines: list[EngineInfo]) -> str:
    servers = "\n".join(f"    server 127.0.0.1:{e.port};" for e in engines)
    temp = "\n".join(
        f"  {kind}_temp_path {tmp}/{kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 256; }}
http {{
  access_log off;
{temp}
  upstream engines {{
{servers}
    keepalive 8;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://engines;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 600s;
    }}
  }}
}}
"""


@pytest.fixture(scope="module")
def nginx(engines: list[EngineInfo], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Debian's nginx, round-robin over the two engines, on loopback; its base URL."""
    binary = shutil.which("nginx") or shutil.which("/usr/sbin/nginx")
    assert binary, "nginx is missing: `make system-deps` installs Debian's nginx-light"
    tmp = tmp_path_factory.mktemp("nginx")
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(nginx_conf(tmp, port, engines))
    proc = subprocess.Popen([binary, "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, (tmp / "error.log").read_text()
                assert time.monotonic() < deadline, "nginx did not listen in 30 s"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


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


async def make_sick(session: aiohttp.ClientSession, engines: list[EngineInfo]) -> dict[str, float]:
    """Slow the second engine until it decodes SLOWDOWN x slower than the first, sizing the
    quota from the measured speeds; what was measured."""
    healthy, _ = await alone(session, engines[0].base_url)
    sick, _ = await alone(session, engines[1].base_url)
    cores = 1.0 / SLOWDOWN  # an engine decoding alone keeps about one core busy
    for _ in range(4):
        hold(sick_limit(engines[1].port, cores), engines[1])
        sick, sick_e2e = await alone(session, engines[1].base_url)
        if sick >= SLOWDOWN * healthy:
            break
        cores *= sick / (SLOWDOWN * healthy) / 1.2  # slower by what is still missing
    assert sick >= SLOWDOWN * healthy, f"could not slow the engine: {sick=:.4f} {healthy=:.4f}"
    return {
        "healthy_decode_s": healthy, "sick_decode_s": sick, "sick_e2e_s": sick_e2e,
        "sick_cores": max(cores, MIN_CORES),
    }  # fmt: skip


def p99(values: list[float]) -> float:
    """The clients' p99 (nearest rank)."""
    ordered = sorted(values)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]


def bucket(value_s: float, edges: list[float]) -> float:
    """The upper edge of the histogram bucket holding ``value_s``."""
    return next(edge for edge in sorted(edges) if value_s <= edge)


def agrees(engine_ms: float | None, client_s: float, edges: list[float]) -> bool:
    """Same histogram bucket, or within 10 %."""
    if engine_ms is None:
        return False
    engine_s = engine_ms / 1000
    return bucket(engine_s, edges) == bucket(client_s, edges) or abs(engine_s - client_s) <= (
        0.1 * client_s
    )


async def measured_window(
    session: aiohttp.ClientSession, http: httpx.AsyncClient, fleet: Target, window_s: float
) -> tuple[ProbeResult, list[RequestRecord], float]:
    """The probe's window over LOAD requests through nginx; the clients' records; load seconds."""
    probe = asyncio.ensure_future(
        VllmMetricsProbe().run(
            target=TargetRef("fleet", fleet),
            params=WindowParams(window_s=window_s, interval_s=INTERVAL_S),
            ctx=ProbeContext(http=http),
        )
    )
    await asyncio.sleep(2 * INTERVAL_S)  # the window's first scrapes precede the load
    started = time.monotonic()
    records = await load(session, fleet.vllm_url)
    load_s = time.monotonic() - started
    return await probe, records, load_s


def verdict_of(result: ProbeResult) -> replicas.FleetVerdict:
    """The replica rule on the probe's window, as the diagnosis reads it."""
    assert result.window is not None
    run = RunbookResult(
        runbook="fleet",
        details={"vllm_metrics": result.details},
        windows={"vllm_metrics": result.window},
    )
    verdict = replicas.of_run(run)
    assert verdict is not None
    return verdict


async def test_fleet_behind_nginx(engines: list[EngineInfo], nginx: str) -> None:
    async with aiohttp.ClientSession() as session, httpx.AsyncClient(timeout=30) as http:
        measured = await make_sick(session, engines)

        # (a) the bot pointed at nginx alone: its scrapes alternate between the two engines
        ctx = ProbeContext(http=http)
        lone = TargetRef("svc", Target(vllm_url=nginx))
        with pytest.raises(ProbeError, match=rf"{nginx} answers from 2 engines.*replicas = "):
            await VllmMetricsProbe().run(
                target=lone, params=WindowParams(window_s=2, interval_s=INTERVAL_S), ctx=ctx
            )

        # (b) the replicas listed: one window over the load, sized from the sick engine's speed
        fleet = Target(vllm_url=nginx, replicas=[e.base_url for e in engines])
        window_s = min(LOAD / 2 * measured["sick_e2e_s"] + 5, 540)  # serially: 3x the need here
        result, records, load_s = await measured_window(session, http, fleet, window_s)

        # (c) the sick engine let go (back to the suite's own limit, if any): both healthy
        hold(sick_limit(engines[1].port, cores_from_environment() or MAX_CORES), engines[1])
        _, healthy_e2e = await alone(session, engines[1].base_url)
        calm_s = min(LOAD / 2 * healthy_e2e + 5, 540)
        calm, _, calm_load_s = await measured_window(session, http, fleet, calm_s)

        # (d) every replica slowed alike (the sick quota on both): a fleet-wide slowness
        for engine in engines:
            hold(sick_limit(engine.port, measured["sick_cores"]), engine)
        slow_s = min(LOAD / 2 * measured["sick_e2e_s"] + 5, 540)
        both, _, both_load_s = await measured_window(session, http, fleet, slow_s)

    clients = p99([r.ttft_s for r in records if r.ttft_s is not None])
    window = result.window
    assert window is not None
    edges = list(window.pages[-1].buckets("vllm:time_to_first_token_seconds"))
    fleet_p99 = result.readings["ttft_p99_ms"]
    per_replica = result.details["replicas"]
    sick_at = Replica(engines[1].base_url).address
    healthy = per_replica[Replica(engines[0].base_url).address]
    sick = per_replica[sick_at]
    verdict, calm_verdict, both_verdict = verdict_of(result), verdict_of(calm), verdict_of(both)
    summary = (
        f"measured {measured}; load {load_s:.1f} s in a {window_s:.1f} s window; client TTFT "
        f"p99 {clients * 1000:.0f} ms, fleet {fleet_p99} ms, healthy {healthy['ttft_p99_ms']} "
        f"ms, sick {sick['ttft_p99_ms']} ms; replicas {per_replica}; "
        f"rule: {replica_text.summary_json(verdict)}; healthy again: load {calm_load_s:.1f} s "
        f"in {calm_s:.1f} s, rule: {replica_text.summary_json(calm_verdict)}; both slow: load "
        f"{both_load_s:.1f} s in {slow_s:.1f} s, fleet TTFT p99 {both.readings['ttft_p99_ms']} "
        f"ms, TPOT p99 {both.readings['tpot_p99_ms']} (healthy {calm.readings['tpot_p99_ms']}) "
        f"ms, rule: {replica_text.summary_json(both_verdict)}"
    )
    print(summary)
    # every request through nginx is counted once in the fleet's window, on one replica
    assert result.readings["requests_finished"] == LOAD, summary
    assert healthy["requests_finished"] + sick["requests_finished"] == LOAD, summary
    assert agrees(fleet_p99, clients, edges), summary
    assert sick["ttft_p99_ms"] > healthy["ttft_p99_ms"], summary
    # the healthy replica alone (what a Service-fronted scrape may read) is not the clients' p99
    assert not agrees(healthy["ttft_p99_ms"], clients, edges), summary
    # the replica rule names the sick one, with its numbers; healthy again, it names none
    assert [r.address for r in verdict.slow] == [sick_at], summary
    (finding, *_) = replica_text.findings(verdict, fleet_slow=True)
    assert finding.message.startswith(f"one replica of 2 is slow: {sick_at} "), summary
    assert replica_text.line(verdict).startswith(f"replicas: {sick_at} "), summary
    assert calm_verdict.kind == "alike" and calm_verdict.slow == [], summary
    assert replica_text.findings(calm_verdict, fleet_slow=False) == [], summary
    # every replica slow: no replica is named (it is the fleet, and the ADRs are offered as for
    # one engine: tests/test_fleet_diagnosis.py), and the fleet decodes slower than when healthy
    assert both_verdict.kind == "alike" and both_verdict.slow == [], summary
    assert not any(
        f.message.startswith("one replica")
        for f in replica_text.findings(both_verdict, fleet_slow=True)
    ), summary
    assert both.readings["tpot_p99_ms"] > 2 * calm.readings["tpot_p99_ms"], summary


async def load(session: aiohttp.ClientSession, base_url: str) -> list[RequestRecord]:
    """LOAD requests through nginx, CONCURRENCY at a time."""
    queue = list(range(LOAD))
    records: list[RequestRecord] = []

    async def client() -> None:
        while queue:
            records.append(await request(session, base_url, queue.pop()))

    await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
    return records
