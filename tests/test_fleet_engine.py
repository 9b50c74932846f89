"""A target that is a fleet, on two real vLLM engines behind a real nginx round-robin.

One engine is made sick: held by a cgroup CPU quota until it decodes several times slower than
its healthy twin (the quota is sized from the speeds measured here, so a slower machine gets a
smaller quota, not a different test). Clients load the fleet through nginx and time their own
first tokens. Pointed at nginx alone, the bot must refuse to give a number (its scrapes come
from two engines); with the replicas listed, the fleet's TTFT p99 must be the clients' and the
per-replica details must show the sick one, and the replica rule must name it. Then the sick
engine is let go, and with both replicas healthy the rule must name none. Last, both are held at
the sick quota, sharing it: the fleet is slow, and the rule must name no replica (a
fleet-wide slowness).

Both engines run on one CPU (every thread pinned to it), so the box's other work slows
them alike: healthy, they are twins by construction, not by the scheduler's luck.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import aiohttp
import httpx
import pytest

from bot.canary.client import RequestRecord
from bot.diagnosis import replica_text, replicas
from bot.diagnosis.causes import one_replica
from bot.diagnosis.probes.context import ProbeContext, TargetRef
from bot.diagnosis.probes.replicas import Replica
from bot.diagnosis.probes.types import ProbeResult
from bot.diagnosis.probes.vllm_window import VllmMetricsProbe, WindowParams
from bot.diagnosis.runbooks.runner import RunbookResult
from bot.engine.cpu_limit import MAX_CORES, cores_from_environment
from bot.engine.process import EngineInfo
from bot.kernel.config import Target
from bot.kernel.errors import ProbeError
from tests.fleet_engines import (  # noqa: F401 (engines, nginx: the fixtures)
    LOAD,
    alone,
    engines,
    hold,
    load,
    make_sick,
    nginx,
    one_cpu,
    p99,
    sick_limit,
)

pytestmark = pytest.mark.engine

INTERVAL_S = 0.5


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


async def test_fleet_behind_nginx(engines: list[EngineInfo], nginx: str) -> None:  # noqa: F811
    with one_cpu(engines):
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

            # (c) the sick engine let go (back to the suite's own limit, if any): both healthy.
            # Each core in a group of its own at the same quota, twins by construction: the
            # let-go one alone in a group weighs as one task against all else on the CPU beside
            # the other (cgroup weights), and once was judged the faster by 2x.
            for engine in engines:
                hold(sick_limit(engine.port, cores_from_environment() or MAX_CORES), engine)
            _, healthy_e2e = await alone(session, engines[1].base_url)
            # both busy on one CPU: at most the LOAD requests one after another on one engine
            calm_s = min(LOAD * healthy_e2e + 5, 540)
            calm, _, calm_load_s = await measured_window(session, http, fleet, calm_s)

            # (d) every replica slowed alike: a fleet-wide slowness. Both cores in ONE group of
            # twice the sick quota, so they are throttled in the same periods: in a group each,
            # at 0.08 core, whichever engine's throttle a prefill waited out had the TTFT p99 of
            # 24 requests (CI: 245 vs 100 ms, TPOT p99 alike), and the rule named it.
            # a 20 ms period: stalls of a fifth as long once the quota is spent, the same speed
            both_slow = replace(
                sick_limit(engines[0].port, 2 * measured["sick_cores"]), period_us=20_000
            )
            for engine in engines:
                hold(both_slow, engine)
            slow_s = min(LOAD / 2 * measured["sick_e2e_s"] + 5, 540)
            both, _, both_load_s = await measured_window(session, http, fleet, slow_s)

    clients = p99([r.ttft_s for r in records if r.ttft_s is not None])
    window = result.window
    assert window is not None
    edges = list(window.pages[-1].buckets("vllm:time_to_first_token_seconds"))
    fleet_p99 = result.readings.value("ttft_p99_ms")
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
        f"{both_load_s:.1f} s in {slow_s:.1f} s, fleet TTFT p99 {both.readings.value('ttft_p99_ms')} "
        f"ms, TPOT p99 {both.readings.value('tpot_p99_ms')} (healthy {calm.readings.value('tpot_p99_ms')}) "
        f"ms, rule: {replica_text.summary_json(both_verdict)}"
    )
    print(summary)
    # every request through nginx is counted once in the fleet's window, on one replica
    assert result.readings.value("requests_finished") == LOAD, summary
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
    # the cause (e): the one sick replica supports it, named; replicas alike rule it out
    cause = one_replica(verdict)
    assert cause.verdict == "supported" and sick_at in cause.number, (cause, summary)
    assert one_replica(calm_verdict).verdict == "ruled_out", ("healthy again", summary)
    assert one_replica(both_verdict).verdict == "ruled_out", ("both slow", summary)
    assert calm_verdict.kind == "alike" and calm_verdict.slow == [], summary
    assert replica_text.findings(calm_verdict, fleet_slow=False) == [], summary
    # every replica slow: no replica is named (it is the fleet, and the ADRs are offered as for
    # one engine: tests/test_fleet_diagnosis.py), and the fleet decodes slower than when healthy
    assert both_verdict.kind == "alike" and both_verdict.slow == [], summary
    assert not any(
        f.message.startswith("one replica")
        for f in replica_text.findings(both_verdict, fleet_slow=True)
    ), summary
    # decode speed is the histogram's exact mean (sum / count), not its p99: a tail quantile of
    # a few dozen requests moves with the box's other work (CI: 74.5 vs 47 ms at 8x the quota)
    assert both.window is not None and calm.window is not None
    slow_mean, calm_mean = both.window.tpot_ms.mean, calm.window.tpot_ms.mean
    assert slow_mean is not None and calm_mean is not None, summary
    assert slow_mean > 2 * calm_mean, (slow_mean, calm_mean, summary)
