"""Gateway overhead: the same streaming load direct to vLLM, through the gateway, through LiteLLM.

    python bench/gateway_bench.py [--concurrency 200] [--requests 400] [--rounds 5] [--no-litellm]
        [--wave warm|cold] [--trace-gateway] [--split-cpus]

Starts its own engine (EngineManager), the gateway (`ruleloop gateway`, its own process), the
same gateway with aiohttp's client as its upstream transport (_aiohttp_upstream.py; --no-aiohttp
to skip), LiteLLM's proxy (its own venv, --litellm) and, with --before DIR, the gateway from an
older checkout in DIR (path "gw-before", to measure a change in one run) in front of it, then
runs the same chat workload against each with the canary's timed streaming client, rotating the
order every round and waiting for every proxy to go idle before each run. Per path: TTFT
p50/p99, TPOT p99, streamed tokens/s, the proxy process's CPU seconds per 1,000 streamed tokens,
and the CPU the box spent outside our processes during the run. Then: TTFT one stream at a time
(the latency a proxy adds when nothing queues), and tokens the engine generated after a client
left mid-stream, direct vs through the gateway.

How a round's wave is sent (``--wave``, issue 20 item 7). ``warm`` (the default): the round's
client session first sends ``--concurrency`` one-token requests at once and reads each to its
end, so it holds a kept-alive connection per stream to every path (and a proxy as many to the
engine); the measured requests then go out on those connections, read to their end too
(``_gateway_bench_wave.stream_to_end``: the canary's own event handling). ``cold``: the bench
before: 16 warm-up requests on a session of their own, then the wave on a new session that opens
a connection per stream, with the canary's ``stream_request``, which leaves each response at
``[DONE]``; straight to vLLM that drops the connection on about one request in three (vLLM ends
the chunked body in a write of its own after ``[DONE]``; the gateway ends it in the same write),
so the direct client opened 204-327 connections per 400-request round, the gateway's 200. Every
round now reports how its wave went out, per path: connections the client and the proxy opened,
when the first ``--concurrency`` requests left the client and reached vLLM (for the gateway its
``upstream_write``, with ``--trace-gateway``: bench/_gateway_trace_hooks.py loaded into it), and
vLLM's own view from its /metrics (TTFT and queue-time means, ``vllm:iteration_tokens_total``:
how many engine steps, how many of 16 tokens or fewer, how many over 1024).

The single-stream phase uses two clients, one after the other, the paths taking turns request
by request on kept-alive, warmed connections: the canary's event handling read to the end
(``bench``) and an independent plain-httpx client (``httpx``,
bench/gateway_lone_stream_check.py); it prints each one's added p50/p99 and the median of the
paired differences side by side. (It used to be the canary's client in blocks of 10 on a new
session per block, unpaired: every 10th request paid a new connection, and straight to vLLM a
third of the others did too.) bench/gateway_lone_stream_check.py runs the old phase, the
canary's client, the new phase and httpx in one run.

With --split-cpus the engine runs on the first CPU and everything else (the proxies, this
client) on the others, so that no proxy's CPU is taken from the engine, as on a GPU host.
--engine-keep-alive S sets how long the engine keeps an idle connection (vLLM's default: 5 s;
``--max-idle-wait`` keeps the wait before a round under it, so warmed connections stay open).
Results: bench/results/gateway_bench.json. Numbers: docs/gateway.md, "Results".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import _gateway_bench_procs as procs
import _gateway_bench_wave as wave
import gateway_lone_stream_check as lone
import httpx
from _gateway_bench_send import USAGE, bodies, drive, new_session
from prometheus_client.parser import text_string_to_metric_families

from bot.canary.client import Outcome
from bot.canary.report import summarize
from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.vllm_metrics import GENERATION_TOKENS, RUNNING, WAITING, gauge
from bot.engine.process import EngineManager, free_port

RESULTS = procs.ROOT / "bench" / "results"
Paths = dict[str, tuple[str, int | None]]  # name -> (base URL, proxy pid or None)


async def engine_generated(client: httpx.AsyncClient, engine_url: str) -> float:
    """generation_tokens_total once the engine is idle and the counter has stopped moving."""
    last = None
    while True:
        page = Exposition.parse((await client.get(f"{engine_url}/metrics")).text, at=0.0)
        total = gauge(page, GENERATION_TOKENS)
        if (gauge(page, RUNNING) or 0) + (gauge(page, WAITING) or 0) == 0 and total == last:
            return total or 0.0
        last = total
        await asyncio.sleep(0.1)


GATEWAY_NEW = "ruleloop_gateway_upstream_requests_total"


async def upstream_new(client: httpx.AsyncClient, base: str) -> float | None:
    """How many requests a ruleloop gateway has sent on new upstream connections (None: not one)."""
    if not base.startswith("http"):
        return None
    try:
        response = await client.get(f"{base}/metrics")
    except httpx.HTTPError:
        return None
    # LiteLLM answers /metrics with a JSON 404 (or a page of its own): not a ruleloop gateway
    if response.status_code != 200 or "text/plain" not in response.headers.get("content-type", ""):
        return None
    try:
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                name, labels = sample.name, sample.labels
                if name == GATEWAY_NEW and labels.get("connection") == "new":
                    return float(sample.value)
    except (ValueError, TypeError, IndexError):
        return None  # not the exposition format
    return None


async def measure(
    name: str, paths: Paths, engine_pid: int, engine_url: str, args: argparse.Namespace, seed: int
) -> dict[str, float]:
    """One load run against one path, after every proxy has gone idle.

    ``--wave warm`` (the default): the round's client session first sends ``concurrency``
    one-token requests at once, so that it holds a kept-alive connection per stream on every
    path (and a proxy holds as many to the engine), and the measured wave then goes out on
    them: every path's wave is sent the same way, with no connection set-up on the clock.
    ``--wave cold``: the bench before (16 warm-up requests on a session of their own, then the
    wave on a new session that opens a connection per stream).
    """
    base, pid = paths[name]
    url = f"{base}/v1/chat/completions"
    proxies = [p for _, p in paths.values() if p]
    arrivals = wave.Arrivals()
    async with contextlib.AsyncExitStack() as stack:
        if args.wave == "warm":
            session = await stack.enter_async_context(new_session(args.concurrency, arrivals))
            warm = bodies(args.concurrency, args.prompt_words, 1, seed + 99)
            await drive(url, warm, args.concurrency, session=session, to_end=True)
        else:
            await drive(url, bodies(16, args.prompt_words, 8, seed + 99), 16)  # warm connections
            session = None
        waited = await asyncio.to_thread(procs.quiesce, proxies, timeout_s=args.max_idle_wait)
        work = bodies(args.requests, args.prompt_words, args.output_tokens, seed)
        async with httpx.AsyncClient(timeout=30) as client:
            before = await engine_generated(client, engine_url)
            page0 = (await client.get(f"{engine_url}/metrics")).text
            ours = [engine_pid, *proxies]
            cpu0, busy0, self0 = (
                [procs.cpu_seconds(p) for p in ours],
                procs.busy_seconds(),
                time.process_time(),
            )
            new0 = await upstream_new(client, base) if pid else None
            if args.trace_gateway:
                args.trace_gateway.write_text("")
            conns0, started = arrivals.new, time.time()
            records, wall = await drive(
                url, work, args.concurrency, session=session, arrivals=arrivals,
                to_end=args.wave == "warm",
            )  # fmt: skip
            new1 = await upstream_new(client, base) if pid else None
            cpu1, busy1, self1 = (
                [procs.cpu_seconds(p) for p in ours],
                procs.busy_seconds(),
                time.process_time(),
            )
            generated = await engine_generated(client, engine_url) - before
            page1 = (await client.get(f"{engine_url}/metrics")).text
    cpu = cpu1[ours.index(pid)] - cpu0[ours.index(pid)] if pid else 0.0
    others = (busy1 - busy0) - sum(cpu1) + sum(cpu0) - (self1 - self0)
    ok = [r for r in records if r.outcome is Outcome.OK]
    if len(ok) < len(records):
        errors = sorted({r.error or "?" for r in records if r.outcome is not Outcome.OK})
        print(f"    {name}: {len(records) - len(ok)} requests failed: {errors[:3]}", flush=True)
    tokens = sum(r.output_tokens for r in records)
    ttft = summarize([r.ttft_s * 1000 for r in ok if r.ttft_s is not None])
    tpot = summarize([r.tpot_s * 1000 for r in ok if r.tpot_s is not None])
    first = [r.ttft_s * 1000 for r in ok[: args.concurrency] if r.ttft_s is not None]
    if pid is None:  # direct: the client's write is the engine's arrival (loopback)
        reached = wave.spread("engine_wave", arrivals.sent, started, args.concurrency)
    elif args.trace_gateway and pid == paths["gateway"][1]:
        writes = wave.upstream_writes(args.trace_gateway)
        reached = wave.spread("engine_wave", writes, started, args.concurrency)
    else:
        reached = {}
    return {
        "ttft_p50": ttft.p50, "ttft_p99": ttft.p99, "tpot_p99": tpot.p99,
        "first_wave_ttft_p50": statistics.median(first) if first else -1.0,
        "tokens_per_s": tokens / wall, "tokens": tokens, "engine_tokens": generated,
        "ok": len(ok), "wall_s": wall, "proxy_cpu_s": cpu,
        "proxy_cpu_per_1k_tokens": cpu / tokens * 1000 if tokens else 0.0,
        "others_cpu_s_per_s": max(others, 0.0) / wall, "idle_wait_s": waited,
        "client_cpu_s": self1 - self0,
        "upstream_new": new1 - new0 if new0 is not None and new1 is not None else -1.0,
        "client_new_conns": arrivals.new - conns0,
        **wave.spread("wave", arrivals.sent, started, args.concurrency),
        **reached,
        **wave.engine_view(page0, page1),
    }  # type: ignore[dict-item]  # fmt: skip


async def one_at_a_time(
    paths: Paths, args: argparse.Namespace
) -> dict[str, dict[str, dict[str, float]]]:
    """TTFT of sequential single streams: what a proxy adds when nothing queues.

    Two clients, one after the other: the canary's (``bench``: aiohttp, one kept-alive session
    per path, warmed before the clock) and an independent one (``httpx``: plain
    ``httpx.AsyncClient``, its own SSE reading; bench/gateway_lone_stream_check.py). With each,
    the paths take turns request by request, so the box's drift lands on every path alike, and
    each proxy request is paired with the direct request sent just before it.
    """
    urls = {name: f"{base}/v1/chat/completions" for name, (base, _) in paths.items()}
    n = args.single_requests + 1  # the first one warms the connection

    def fresh(seed: int) -> dict[str, list[dict[str, object]]]:
        return {name: bodies(n, args.prompt_words, 16, seed + i) for i, name in enumerate(urls)}

    print("  client        path      TTFT ms", flush=True)
    return {
        "bench": lone.table("bench", await lone.lone_aiohttp(urls, fresh(7))),
        "httpx": lone.table("httpx", await lone.lone_httpx(urls, fresh(700))),
    }


async def disconnect_drain(base: str, engine_url: str, trials: int) -> list[float]:
    """Tokens the engine generated after a client left mid-stream (10 tokens in), per trial."""
    extra = []
    request = {"model": "tiny-llama", "prompt": [100 + i for i in range(8)], "max_tokens": 4000,
               "ignore_eos": True, "stream": True, "stream_options": USAGE}  # fmt: skip
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(trials):
            before = await engine_generated(client, engine_url)
            received = 0
            async with client.stream("POST", f"{base}/v1/completions", json=request) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        received = json.loads(line[6:])["usage"]["completion_tokens"]
                        if received >= 10:
                            break
            extra.append(await engine_generated(client, engine_url) - before - received)
    return extra


async def run_all(
    paths: Paths, engine_pid: int, engine_url: str, args: argparse.Namespace
) -> dict[str, object]:
    """Rounds of every path in rotating order, then single-stream latency and disconnect drain."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
    names = list(paths)
    for i in range(args.rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            print(
                f"round {i + 1}/{args.rounds}: {name} ({args.concurrency} streams) ...", flush=True
            )
            result = await measure(
                name, paths, engine_pid, engine_url, args, 1000 * i + names.index(name)
            )
            runs[name].append(result)
            print("   ", {k: round(v, 2) for k, v in result.items()}, flush=True)
    print(f"one stream at a time ({args.single_requests} requests per path) ...", flush=True)
    await asyncio.to_thread(procs.quiesce, [p for _, p in paths.values() if p])
    single = await one_at_a_time(paths, args)
    drain = {}
    for name in ("direct", "gateway", *(["gw-before"] if "gw-before" in paths else [])):
        print(f"disconnect drain: {name} ({args.drain_trials} trials) ...", flush=True)
        drain[name] = await disconnect_drain(paths[name][0], engine_url, args.drain_trials)
        print("    extra tokens after disconnect:", drain[name], flush=True)
    median = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
    return {"runs": runs, "median": median, "single": single, "drain": drain}


def print_table(result: dict[str, object], args: argparse.Namespace) -> None:
    """The comparison tables: each path against direct."""
    median: dict[str, dict[str, float]] = result["median"]  # type: ignore[assignment]
    single: dict[str, dict[str, dict[str, float]]] = result["single"]  # type: ignore[assignment]
    direct = median["direct"]
    print(
        f"\n{args.concurrency} concurrent streams, {args.requests} chat requests, "
        f"{args.prompt_words}-word prompt, {args.output_tokens} output tokens, "
        f"median of {args.rounds} rounds"
        + (", engine on its own CPU" if args.split_cpus else "")
        + (f", engine keep-alive {args.engine_keep_alive} s" if args.engine_keep_alive else "")
    )
    head = (
        f"{'path':<11}{'TTFT p50':>9}{'TTFT p99':>9}{'p99 ratio':>10}{'TPOT p99':>9}"
        f"{'tok/s':>7}{'tok/s ratio':>12}{'proxy CPU s/1k tok':>19}{'others CPU':>11}"
    )
    print(head + "\n" + "-" * len(head))
    for name, m in median.items():
        cpu = f"{m['proxy_cpu_per_1k_tokens']:.3f}" if name != "direct" else "-"
        ttft_ratio = m["ttft_p99"] / direct["ttft_p99"]
        tps_ratio = m["tokens_per_s"] / direct["tokens_per_s"]
        print(f"{name:<11}{m['ttft_p50']:>9.0f}{m['ttft_p99']:>9.0f}{ttft_ratio:>10.3f}"
              f"{m['tpot_p99']:>9.0f}{m['tokens_per_s']:>7.0f}{tps_ratio:>12.3f}"
              f"{cpu:>19}{m['others_cpu_s_per_s']:>10.2f}c")  # fmt: skip
    print(
        f"\nhow each wave went out ({args.wave} connections; median of rounds): new connections "
        "the client opened / the proxy opened to vLLM; ms after the round began at which the "
        f"first {args.concurrency} requests left the client and reached vLLM (first-last); and "
        "what vLLM saw (its TTFT and queue-time means, engine steps: all, of <=16 tokens, "
        "of >1024)"
    )
    head = (
        f"{'path':<11}{'conns':>10}{'client wave':>14}{'at vLLM':>14}{'1st-wave TTFT':>14}"
        f"{'vLLM TTFT':>10}{'queue':>7}{'steps':>7}{'<=16':>6}{'>1024':>6}"
    )
    print(head + "\n" + "-" * len(head))
    for name, m in median.items():
        conns = f"{m['client_new_conns']:.0f}/" + (
            f"{m['upstream_new']:.0f}" if m["upstream_new"] >= 0 else "-"
        )
        client = f"{m.get('wave_first_ms', -1):.0f}-{m.get('wave_last_ms', -1):.0f}"
        at = (
            f"{m['engine_wave_first_ms']:.0f}-{m['engine_wave_last_ms']:.0f}"
            if "engine_wave_first_ms" in m
            else "?"
        )
        small = sum(m.get(f"eng_steps_le_{n}", 0.0) for n in (1, 8, 16))
        big = sum(v for k, v in m.items() if k.startswith("eng_steps_le_") and float(k[13:]) > 1024)
        print(f"{name:<11}{conns:>10}{client:>14}{at:>14}{m['first_wave_ttft_p50']:>14.0f}"
              f"{m['eng_ttft_mean']:>10.0f}{m['eng_queue_mean']:>7.0f}{m['eng_steps']:>7.0f}"
              f"{small:>6.0f}{big:>6.0f}")  # fmt: skip
    print(f"\none stream at a time ({args.single_requests} requests per path and client, "
          "16 tokens, paths taking turns per request): TTFT ms")  # fmt: skip
    for client, rows in single.items():
        for name, r in rows.items():
            if name == "direct":
                print(f"  {client:<7}{name:<11}p50 {r['p50']:7.2f}  p99 {r['p99']:7.2f}")
                continue
            other = "httpx" if client == "bench" else "bench"
            o = single.get(other, {}).get(name, {})
            print(f"  {client:<7}{name:<11}p50 {r['p50']:7.2f}  p99 {r['p99']:7.2f}  added: p50 "
                  f"{r['added_p50']:+6.2f}  p99 {r['added_p99']:+6.2f}  paired median "
                  f"{r['paired_median']:+6.2f}"
                  + (f"  ({other}: {o['paired_median']:+6.2f})" if o else ""))  # fmt: skip
    drain: dict[str, list[float]] = result["drain"]  # type: ignore[assignment]
    print("\nextra tokens generated after a client left mid-stream (median; all trials):")
    for name, values in drain.items():
        print(f"  {name:<11}{statistics.median(values):>5.0f}   {values}")


def main() -> None:
    """Start engine and proxies, run the rounds, print the tables, save the JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--prompt-words", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--wave", choices=("warm", "cold"), default="warm",
        help="warm: each round's wave goes out on connections opened before the clock starts "
        "(the default); cold: on new connections, as the bench did before",
    )  # fmt: skip
    parser.add_argument(
        "--trace-gateway", action="store_true",
        help="load bench/_gateway_trace_hooks.py into the gateway, to report when its wave "
        "reached vLLM (engine_wave_*: direct, when the client wrote it)",
    )  # fmt: skip
    parser.add_argument(
        "--max-idle-wait", type=float, default=3.0, metavar="S",
        help="longest wait for the proxies to go idle before a round (under vLLM's 5 s "
        "keep-alive, so that the warmed connections are still open)",
    )  # fmt: skip
    parser.add_argument("--single-requests", type=int, default=60)
    parser.add_argument("--drain-trials", type=int, default=5)
    parser.add_argument(
        "--litellm", default="/work/venvs/litellm/bin/litellm", help="LiteLLM's CLI (own venv)"
    )
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument(
        "--no-aiohttp", action="store_true", help="skip the gateway over aiohttp's client"
    )
    parser.add_argument(
        "--before", type=Path, metavar="DIR",
        help="also run the gateway from the checkout in DIR (its bot/ package) as gw-before",
    )  # fmt: skip
    parser.add_argument(
        "--split-cpus", action="store_true",
        help="the engine on the first CPU, the proxies and the client on the others",
    )  # fmt: skip
    parser.add_argument(
        "--engine-keep-alive", type=int, metavar="S",
        help="seconds vLLM keeps an idle connection open (VLLM_HTTP_TIMEOUT_KEEP_ALIVE)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.engine_keep_alive is not None:
        os.environ["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] = str(args.engine_keep_alive)

    tmp = Path(tempfile.mkdtemp(prefix="ruleloop-gw-bench-"))
    manager = EngineManager(state_dir=tmp)
    port = free_port()
    cpus = os.sched_getaffinity(0)
    if args.split_cpus:
        if len(cpus) < 2:
            raise SystemExit(f"--split-cpus needs 2 CPUs or more; this process may use {cpus}")
        os.sched_setaffinity(0, {min(cpus)})  # the engine's processes inherit it
    print(f"starting vLLM on port {port} ...", flush=True)
    info = manager.start(
        port=port, flags=["--enforce-eager", "--max-num-seqs", "256"], on_progress=print
    )
    if args.split_cpus:
        os.sched_setaffinity(0, cpus - {min(cpus)})  # the proxies and the client
        print(f"engine on CPU {min(cpus)}; proxies and client on {sorted(cpus - {min(cpus)})}")
    started = []
    try:
        gw_port = free_port()
        if args.trace_gateway:  # the gateway's hooks stamp when each request left for vLLM
            args.trace_gateway = tmp / "gateway-hooks.log"
            os.environ["RULELOOP_GATEWAY_TRACE"] = str(args.trace_gateway)
        gateway = procs.start_gateway(
            info.base_url, gw_port, tmp / "gateway.log",
            prelude="import _gateway_trace_hooks; " if args.trace_gateway else "",
        )  # fmt: skip
        started.append(gateway)
        paths: Paths = {
            "direct": (info.base_url, None),
            "gateway": (f"http://127.0.0.1:{gw_port}", gateway.pid),
        }
        procs.wait_ready(f"{paths['gateway'][0]}/v1/models", gateway, "the gateway")
        if not args.no_aiohttp:
            aio_port = free_port()
            aio = procs.start_gateway(
                info.base_url, aio_port, tmp / "gateway-aiohttp.log",
                prelude="import _aiohttp_upstream; ",
            )  # fmt: skip
            started.append(aio)
            paths["gw-aiohttp"] = (f"http://127.0.0.1:{aio_port}", aio.pid)
            procs.wait_ready(f"{paths['gw-aiohttp'][0]}/v1/models", aio, "the aiohttp gateway")
        if args.before:
            old_port = free_port()
            old = procs.start_gateway(
                info.base_url, old_port, tmp / "gateway-before.log",
                prelude=f"import sys; sys.path.insert(0, {str(args.before.resolve())!r}); ",
            )  # fmt: skip
            started.append(old)
            paths["gw-before"] = (f"http://127.0.0.1:{old_port}", old.pid)
            procs.wait_ready(f"{paths['gw-before'][0]}/v1/models", old, "the older gateway")
        if not args.no_litellm and Path(args.litellm).exists():
            print("starting LiteLLM proxy ...", flush=True)
            ll_port = free_port()
            litellm = procs.start_litellm(args.litellm, info.base_url, ll_port, tmp)
            started.append(litellm)
            paths["litellm"] = (f"http://127.0.0.1:{ll_port}", litellm.pid)
            procs.wait_ready(f"{paths['litellm'][0]}/v1/models", litellm, "LiteLLM")
        elif not args.no_litellm:
            print(f"LiteLLM not found at {args.litellm}; skipping the peer", flush=True)
        try:
            import uvloop

            result = uvloop.run(run_all(paths, info.pid, info.base_url, args))
        except ImportError:
            result = asyncio.run(run_all(paths, info.pid, info.base_url, args))
    finally:
        procs.stop(started)
        manager.stop(port)
    print_table(result, args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gateway_bench.json").write_text(
        json.dumps({"args": vars(args), **result}, indent=2, default=str)
    )


if __name__ == "__main__":
    main()
