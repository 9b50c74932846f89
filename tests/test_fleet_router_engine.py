"""A fleet behind a real vllm-router (PyPI's, a Rust binary): two real vLLM engines, one made
sick as in tests/test_fleet_engine.py (a cgroup CPU quota on its core, sized from the speeds
measured here), load through the router, and the bot given only the router's URL.

The replicas must be the router's workers (GET /workers, whose shape tests/test_fleet_router.py
fakes: checked here), the fleet's window must count every request the router sent, the replica
rule must name the sick one, and the router's own share of the clients' TTFT p99 (their p99
minus the engines' merged p99) is measured and must be small: the router is not the cause.

vllm-router is not a dependency of the bot: it is installed once into a cache directory of its
own (``RULELOOP_VLLM_ROUTER`` names a binary instead); the module is skipped, saying why, when
it cannot be.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest

from bot.diagnosis import replica_text
from bot.diagnosis.causes import ADDED_MS, one_replica
from bot.diagnosis.probes.context import resolve_replicas
from bot.diagnosis.probes.replicas import Replica
from bot.engine.process import EngineInfo, free_port
from bot.kernel.config import Target
from tests.fleet_engines import LOAD, engines, make_sick, one_cpu, p99  # noqa: F401 (fixture)
from tests.test_fleet_engine import agrees, measured_window, verdict_of

pytestmark = pytest.mark.engine

VERSION = "0.1.17"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ruleloop"
START_S = 60.0


def router_binary() -> str:
    """vllm-router: RULELOOP_VLLM_ROUTER, else one on PATH, else installed (once) into a venv
    under the cache directory; the module is skipped when none can be had."""
    named = os.environ.get("RULELOOP_VLLM_ROUTER") or shutil.which("vllm-router")
    if named:
        return named
    venv = CACHE / f"vllm-router-{VERSION}"
    binary = venv / "bin" / "vllm-router"
    if not binary.exists():
        try:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                           capture_output=True, timeout=120)  # fmt: skip
            subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                            f"vllm-router=={VERSION}"], check=True, capture_output=True,
                           timeout=600)  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            said = getattr(exc, "stderr", b"") or b""
            pytest.skip(f"vllm-router {VERSION} could not be installed into {venv} "
                        f"({exc}; {said.decode(errors='replace')[-300:]})")  # fmt: skip
    return str(binary)


@contextlib.contextmanager
def vllm_router(workers: list[str]) -> Iterator[tuple[str, str]]:
    """The real router, round-robin over ``workers``, on loopback while the block runs; its
    base URL and its Prometheus page's URL."""
    port, metrics_port = free_port(), free_port()
    while metrics_port == port:
        metrics_port = free_port()
    command = [router_binary(), "--host", "127.0.0.1", "--port", str(port), "--policy",
               "round_robin", "--prometheus-host", "127.0.0.1", "--prometheus-port",
               str(metrics_port), "--worker-urls", *workers]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="vllm-router-") as where:
        log = Path(where) / "router.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            _ready(f"http://127.0.0.1:{port}", proc, log)
            yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until the router says every worker is healthy (GET /readiness)."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"vllm-router exited: {log.read_text(errors='replace')[-800:]}"
        with contextlib.suppress(httpx.HTTPError, socket.error):
            if httpx.get(f"{url}/readiness", timeout=2).json().get("status") == "ready":
                return
        time.sleep(0.2)
    raise AssertionError(f"vllm-router not ready in {START_S:g} s: {log.read_text()[-800:]}")


def router_seconds(page: str) -> tuple[float, float]:
    """vllm_router_generate_duration_seconds' sum and count: the router's time from a request's
    arrival to the engine's response headers (for a stream, not its first token)."""
    values = {}
    for line in page.splitlines():
        name, _, value = line.partition(" ")
        if name in ("vllm_router_generate_duration_seconds_sum",
                    "vllm_router_generate_duration_seconds_count"):  # fmt: skip
            values[name.rsplit("_", 1)[1]] = float(value)
    return values.get("sum", 0.0), values.get("count", 0.0)


async def test_fleet_behind_vllm_router(engines: list[EngineInfo]) -> None:  # noqa: F811
    workers = [e.base_url for e in engines]
    with vllm_router(workers) as (url, router_metrics), one_cpu(engines):
        # the real router's worker list: the shape the wire tests fake
        listed = httpx.get(f"{url}/workers", timeout=10).json()
        assert sorted(w["url"] for w in listed["workers"]) == sorted(workers), listed
        assert all(w["worker_type"] == "regular" and w["is_healthy"] for w in listed["workers"])
        fleet = Target(vllm_url=url, router_url=url, kubernetes_networks=["127.0.0.0/8"])
        assert sorted(r.url for r in await resolve_replicas(fleet)) == sorted(workers)

        async with aiohttp.ClientSession() as session, httpx.AsyncClient(timeout=30) as http:
            measured = await make_sick(session, engines)
            before = router_seconds((await http.get(router_metrics)).text)
            window_s = min(LOAD / 2 * measured["sick_e2e_s"] + 5, 540)
            result, records, load_s = await measured_window(session, http, fleet, window_s)
            after = router_seconds((await http.get(router_metrics)).text)

    ttfts = [r.ttft_s for r in records if r.ttft_s is not None]
    clients = p99(ttfts)
    assert result.window is not None
    engines_mean = result.window.engine.ttft_ms.mean  # exact: the histogram's sum / count
    assert engines_mean is not None
    # the router's share of a mean TTFT (and the HTTP hop's): p99s are read from buckets, so
    # their difference is the buckets' error as much as the router's (once -37 ms)
    share_ms = 1000 * sum(ttfts) / len(ttfts) - engines_mean
    edges = list(result.window.pages[-1].buckets("vllm:time_to_first_token_seconds"))
    fleet_p99 = result.readings.value("ttft_p99_ms")
    assert fleet_p99 is not None
    per_replica = result.details["replicas"]
    sick_at, healthy_at = Replica(workers[1]).address, Replica(workers[0]).address
    verdict = verdict_of(result)
    routed = after[1] - before[1]
    to_headers_ms = 1000 * (after[0] - before[0]) / routed if routed else None
    summary = (
        f"measured {measured}; load {load_s:.1f} s in a {window_s:.1f} s window; client TTFT p99 "
        f"{clients * 1000:.0f} ms, engines merged {fleet_p99:.0f} ms (difference "
        f"{clients * 1000 - fleet_p99:.0f} ms); mean TTFT: router share {share_ms:.1f} ms of "
        f"{1000 * sum(ttfts) / len(ttfts):.0f} ms; healthy {per_replica[healthy_at]['ttft_p99_ms']} "
        f"ms, sick {per_replica[sick_at]['ttft_p99_ms']} ms; router: {routed:.0f} requests, "
        f"mean to the engine's headers {to_headers_ms} ms; rule: "
        f"{replica_text.summary_json(verdict)}"
    )
    print(summary)
    # every request the router sent is counted once, on the replica it went to
    assert result.readings.value("requests_finished") == LOAD, summary
    assert routed == LOAD, summary
    # the router adds little: the clients' p99 is the engines' (same bucket, or within 10 %),
    # and their mean TTFT under gateway_latency's floor above the engines' (it would be ruled out)
    assert agrees(fleet_p99, clients, edges), summary
    assert share_ms < ADDED_MS, summary
    # the replica rule names the sick worker, found through the router
    assert [r.address for r in verdict.slow] == [sick_at], summary
    assert replica_text.line(verdict).startswith(f"replicas: {sick_at} "), summary
    cause = one_replica(verdict)
    assert cause.verdict == "supported" and sick_at in cause.number, (cause, summary)
