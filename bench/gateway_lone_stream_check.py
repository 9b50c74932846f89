"""The lone-stream TTFT a proxy adds, measured four ways in one run, side by side.

    python bench/gateway_lone_stream_check.py [--requests 100] [--split-cpus]

Starts its own engine and the gateway (as bench/gateway_bench.py does) and sends single
streaming chat requests (16 tokens) one at a time, four ways:

  bench, before  gateway_bench.py's old single-stream phase: the canary's aiohttp client, the
                 paths taking turns in blocks of 10, each block on a new client session (so
                 every 10th request opens a new connection), TTFT unpaired
  canary, kept   the canary's aiohttp client (bot.canary.client.stream_request) on one
                 kept-alive session per path (warmed by one request), the paths taking turns
                 request by request; it leaves each response at [DONE], and straight to vLLM
                 that drops the connection on about one request in three (vLLM ends the
                 chunked body in a write of its own after [DONE])
  bench, now     the same, with each response read to its end (the canary's event handling,
                 _gateway_bench_wave.stream_to_end): no path drops a connection
  httpx          an independent client: plain ``httpx.AsyncClient`` per path (kept alive,
                 warmed), its own SSE reading, paths taking turns request by request

TTFT is time.perf_counter() from just before the request is sent to the first event that
carries a token (``usage.completion_tokens >= 1``) for all four. For each it prints direct's
p50/p99, the proxy's, what the proxy adds (p50 and p99 of each path, subtracted), the median
of the paired differences (each proxy request against the direct request sent just before it),
and how many requests opened a new connection. gateway_bench.py runs ``bench, now`` and
``httpx`` at the end of every run and prints them side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import _gateway_bench_procs as procs
import _gateway_bench_send as send
import _gateway_bench_wave as wave
import aiohttp
import httpx

from bot.canary.client import Outcome, RequestRecord, stream_request
from bot.engine.process import EngineManager, free_port

Bodies = dict[str, list[dict[str, object]]]  # path name -> its requests, in order


def pct(values: list[float], q: float) -> float:
    """The q-quantile, nearest rank (as bot.canary.report.summarize)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


async def lone_aiohttp(
    urls: dict[str, str], bodies: Bodies, *, to_end: bool = True
) -> dict[str, dict[str, list[float]]]:
    """The canary's client, one kept-alive session per path, paths taking turns per request.

    ``to_end``: each response read to its end (_gateway_bench_wave.stream_to_end), so that no
    path drops its connection; else the canary's own ``stream_request``, which leaves at
    ``[DONE]`` (and straight to vLLM often loses the connection with it).
    """
    send = wave.stream_to_end if to_end else stream_request
    news = {name: 0 for name in urls}
    out: dict[str, dict[str, list[float]]] = {name: {"ttft": []} for name in urls}

    def counter(name: str) -> aiohttp.TraceConfig:
        config = aiohttp.TraceConfig()

        async def on_new(_s: object, _c: SimpleNamespace, _p: object) -> None:
            news[name] += 1

        config.on_connection_create_end.append(on_new)
        return config

    sessions = {n: aiohttp.ClientSession(trace_configs=[counter(n)]) for n in urls}
    try:
        for name, url in urls.items():  # warm: one connection per path, before the clock
            await send(sessions[name], url, bodies[name][0], RequestRecord(0.0))
        before = dict(news)
        names = list(urls)
        for i in range(1, len(next(iter(bodies.values())))):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                record = RequestRecord(sent_at=time.perf_counter())
                await send(sessions[name], urls[name], bodies[name][i], record, timeout_s=60)
                ok = record.outcome is Outcome.OK and record.ttft_s is not None
                out[name]["ttft"].append(record.ttft_s * 1000 if ok else float("nan"))  # type: ignore[operator]
        for name in urls:
            out[name]["new_connections"] = [float(news[name] - before[name])]
    finally:
        for session in sessions.values():
            await session.close()
    return out


async def _httpx_one(client: httpx.AsyncClient, url: str, body: dict[str, object]) -> float:
    """TTFT (ms) of one stream: send -> first event with completion_tokens >= 1."""
    first = float("nan")
    started = time.perf_counter()
    async with client.stream("POST", url, json=body) as response:
        async for line in response.aiter_lines():
            if first == first or not line.startswith("data: {"):  # noqa: PLR0124 (nan check)
                continue
            usage = json.loads(line[6:]).get("usage") or {}
            if (usage.get("completion_tokens") or 0) >= 1:
                first = (time.perf_counter() - started) * 1000
    return first


async def lone_httpx(urls: dict[str, str], bodies: Bodies) -> dict[str, dict[str, list[float]]]:
    """An independent client: plain httpx, one kept-alive client per path, turns per request."""
    out: dict[str, dict[str, list[float]]] = {name: {"ttft": []} for name in urls}
    clients = {name: httpx.AsyncClient(timeout=60) for name in urls}
    try:
        for name, url in urls.items():
            await _httpx_one(clients[name], url, bodies[name][0])
        names = list(urls)
        for i in range(1, len(next(iter(bodies.values())))):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                out[name]["ttft"].append(await _httpx_one(clients[name], urls[name],
                                                          bodies[name][i]))  # fmt: skip
    finally:
        for client in clients.values():
            await client.aclose()
    return out


def table(method: str, result: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Per path: p50, p99, added p50/p99 and the paired median; printed as one line each."""
    base = [v for v in result["direct"]["ttft"] if v == v]  # noqa: PLR0124
    rows: dict[str, dict[str, float]] = {}
    for name, r in result.items():
        values = [v for v in r["ttft"] if v == v]  # noqa: PLR0124
        pairs = [g - d for g, d in zip(r["ttft"], result["direct"]["ttft"], strict=True)
                 if g == g and d == d]  # noqa: PLR0124  # fmt: skip
        row = {
            "n": len(values), "p50": pct(values, 0.5), "p99": pct(values, 0.99),
            "added_p50": pct(values, 0.5) - pct(base, 0.5),
            "added_p99": pct(values, 0.99) - pct(base, 0.99),
            "paired_median": statistics.median(pairs) if pairs else 0.0,
            "new_connections": (r.get("new_connections") or [-1.0])[0],
        }  # fmt: skip
        rows[name] = row
        added = "" if name == "direct" else (
            f"  added p50 {row['added_p50']:+6.2f} p99 {row['added_p99']:+6.2f}"
            f"  paired median {row['paired_median']:+6.2f}"
        )  # fmt: skip
        conns = f"  new conns {row['new_connections']:.0f}" if row["new_connections"] >= 0 else ""
        print(f"  {method:<14}{name:<10}p50 {row['p50']:7.2f}  p99 {row['p99']:7.2f}"
              f"{added}{conns}", flush=True)  # fmt: skip
    return rows


async def compare(
    bases: dict[str, str], n: int, words: int, *, before: bool
) -> dict[str, dict[str, dict[str, float]]]:
    """The methods one after the other on the same engine and gateway; their tables."""
    urls = {name: f"{base}/v1/chat/completions" for name, base in bases.items()}
    out: dict[str, dict[str, dict[str, float]]] = {}

    def fresh(seed: int) -> Bodies:
        return {name: send.bodies(n + 1, words, 16, seed + i)
                for i, name in enumerate(urls)}  # fmt: skip

    if before:  # the bench's old phase: blocks of 10, a new session per block, unpaired
        old: dict[str, dict[str, list[float]]] = {name: {"ttft": []} for name in urls}
        for block in range(max(1, n // 10)):
            for name, url in urls.items():
                records, _ = await send.drive(url, send.bodies(10, words, 16, 7 + block), 1)
                old[name]["ttft"] += [r.ttft_s * 1000 if r.ttft_s is not None else float("nan")
                                      for r in records]  # fmt: skip
        out["bench, before"] = table("bench, before", old)
        canary = await lone_aiohttp(urls, fresh(150), to_end=False)
        out["canary, kept"] = table("canary, kept", canary)
    out["bench, now"] = table("bench, now", await lone_aiohttp(urls, fresh(300)))
    out["httpx"] = table("httpx", await lone_httpx(urls, fresh(600)))
    return out


def main() -> None:
    """Start an engine and the gateway, compare the methods, save the JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=100, help="per path and method")
    parser.add_argument("--prompt-words", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=1, help="run the comparison this often")
    parser.add_argument("--split-cpus", action="store_true")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ruleloop-lone-check-"))
    manager = EngineManager(state_dir=tmp)
    port = free_port()
    cpus = os.sched_getaffinity(0)
    if args.split_cpus:
        os.sched_setaffinity(0, {min(cpus)})
    info = manager.start(port=port, flags=["--enforce-eager", "--max-num-seqs", "256"])
    if args.split_cpus:
        os.sched_setaffinity(0, cpus - {min(cpus)})
    gateway = None
    results = []
    try:
        gw_port = free_port()
        gateway = procs.start_gateway(info.base_url, gw_port, tmp / "gateway.log")
        bases = {"direct": info.base_url, "gateway": f"http://127.0.0.1:{gw_port}"}
        procs.wait_ready(f"{bases['gateway']}/v1/models", gateway, "the gateway")
        for i in range(args.repeat):
            print(f"run {i + 1}/{args.repeat}: {args.requests} requests per path and method, "
                  "TTFT ms", flush=True)  # fmt: skip
            results.append(asyncio.run(compare(bases, args.requests, args.prompt_words,
                                               before=True)))  # fmt: skip
    finally:
        if gateway is not None:
            procs.stop([gateway])
        manager.stop(port)
    out = procs.ROOT / "bench" / "results" / "gateway_lone_stream_check.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "runs": results}, indent=2))


if __name__ == "__main__":
    main()
