"""Where a lone stream's time goes through the gateway: a timestamp at every hop, per request.

    python bench/gateway_trace.py [--requests 60] [--code DIR] [--fake-engine]

Sends single streaming chat requests one at a time, alternating straight to the engine and
through the gateway (its own process, stamped by _gateway_trace_hooks.py), first on a fresh
gateway and then again after a 200-stream burst through it. For each request it lines up:

  client sent -> gateway got it -> request to engine -> engine wrote the first token
  -> gateway read it -> gateway wrote it -> client got it

"engine wrote" and "gateway wrote" are the packets' times on the loopback wire (tcpdump, when
installed); the rest are wall-clock stamps in each process. It prints each hop's p50/p90/max
and the TTFT the gateway adds (p50/p90/p99, paired with the direct request sent just before).
``--code DIR`` runs the gateway from another checkout's ``bot/`` (to trace old code beside new);
``--fake-engine`` uses a scripted SSE server (bench/_trace_engine.py) instead of vLLM.

    python bench/gateway_trace.py --burst 3 --burst-requests 300 [--save stamps.json]

traces the 200-stream bursts instead, request by request (each carries an ``x-trace-id``):
the client's send, connection and first token; the gateway's accept, arrival, admission,
upstream connect, write, the engine's head, the first token's read and send; the scripted
engine's own stamps with --fake-engine. Per path: each hop's p50/p90/p99 and its median in the
TTFT tail, when the burst's first wave reached each hop, each process's CPU time and its wait
for a CPU (schedstat), and the gateway's garbage collections.

    python bench/gateway_trace.py --drain 5

traces the bench's disconnect-drain trial: of the tokens the engine made beyond what the client
took, how many the gateway had read before the client left, while it reacted, and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import _gateway_bench_procs as procs
import _gateway_bench_send as send
import aiohttp

from bot.canary.client import Outcome, RequestRecord, stream_request
from bot.engine.process import EngineManager, free_port
from bot.kernel.runtime import loop

FIRST_TOKEN = re.compile(r'"completion_tokens":\s*1[,}]')
PACKET = re.compile(r"^(\d+\.\d+) IP 127\.0\.0\.1\.(\d+) > 127\.0\.0\.1\.(\d+):")
USAGE = {"include_usage": True, "continuous_usage_stats": True}
PROMPT = [{"role": "user", "content": "trace one request through every hop"}]
BODY = {"model": "tiny-llama", "max_tokens": 16, "ignore_eos": True, "temperature": 0.0,
        "stream": True, "stream_options": USAGE, "messages": PROMPT}  # fmt: skip


@dataclass
class Trace:
    """One request's timestamps (seconds, wall clock)."""

    sent: float
    got: float
    hops: dict[str, float] = field(default_factory=dict)


class Wire:
    """tcpdump on loopback: when each first-token event left the engine and the gateway."""

    def __init__(self, engine_port: int, gateway_port: int, path: Path) -> None:
        self.ports = {engine_port: "engine_wrote", gateway_port: "gateway_wrote"}
        self.requests = {engine_port: "request_to_engine", gateway_port: "request_to_gateway"}
        self.path = path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        tcpdump = shutil.which("tcpdump")
        if tcpdump is None:
            print("tcpdump not installed: no wire timestamps", flush=True)
            return
        ports = " or ".join(f"tcp port {p}" for p in self.ports)
        self.proc = subprocess.Popen(  # noqa: S603
            [tcpdump, "-i", "lo", "-n", "-tt", "-l", "-A", "-s", "0", ports],
            stdout=self.path.open("wb"), stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1.0)

    def stop(self) -> list[tuple[float, str]]:
        """(time, hop) of every packet that carried a first token or a request."""
        if self.proc is None:
            return []
        time.sleep(0.5)
        self.proc.terminate()
        self.proc.wait()
        found: list[tuple[float, str]] = []
        current: tuple[float, str] | None = None
        request: tuple[float, str] | None = None
        payload: list[str] = []
        for line in self.path.read_text(errors="replace").splitlines() + ["0.0 IP end"]:
            m = PACKET.match(line)
            if m or line.startswith("0.0 IP end"):
                text = "".join(payload)
                if current and FIRST_TOKEN.search(text):
                    found.append(current)
                elif request and "POST /v1/" in text:
                    found.append(request)
                hop = self.ports.get(int(m.group(2))) if m else None
                to = self.requests.get(int(m.group(3))) if m else None
                if m and to and "Flags [S]," in line:  # a new connection: the last one not reused
                    found.append((float(m.group(1)), "connect_" + to.removeprefix("request_")))
                current = (float(m.group(1)), hop) if m and hop else None
                request = (float(m.group(1)), to) if m and to else None
                payload = []
            else:
                payload.append(line)
        return found


def read_hooks(path: Path) -> list[tuple[float, str]]:
    """(time, hop) lines the gateway's hooks wrote without a request id (lone streams)."""
    out = []
    for line in path.read_text().splitlines():
        hop, ns, *rest = line.split()
        if not rest:
            out.append((int(ns) / 1e9, hop))
    return out


async def lone(url: str, n: int, traces: list[Trace]) -> None:
    """``n`` single streams, one at a time, on one keep-alive connection (as the bench does)."""
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            record = RequestRecord(sent_at=time.time())
            await stream_request(session, url, BODY, record, timeout_s=60, clock=time.time)
            if record.outcome is Outcome.OK and record.first_token_at is not None:
                traces.append(Trace(record.sent_at, record.first_token_at))
            await asyncio.sleep(0.02)


async def burst(url: str, requests: int, concurrency: int) -> None:
    """A loaded round through the gateway, as the bench's 200-stream rounds."""
    queue = list(range(requests))
    body = {**BODY, "max_tokens": 64}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def worker() -> None:
            while queue:
                queue.pop()
                await stream_request(session, url, body, RequestRecord(sent_at=0.0), timeout_s=600)

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def attach(traces: list[Trace], stamps: list[tuple[float, str]]) -> None:
    """Give each request the first stamp of each hop inside its [sent, got] window."""
    stamps = sorted(stamps)
    for t in traces:
        for at, hop in stamps:
            if t.sent <= at <= t.got + 0.001 and hop not in t.hops:
                t.hops[hop] = at


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(name: str, direct: list[Trace], via: list[Trace]) -> None:
    """Per-hop times and the TTFT the gateway added."""
    print(f"\n== {name}: {len(direct)} direct, {len(via)} through the gateway (ms) ==")
    chains = {
        "direct": (direct, ["sent", "request_to_engine", "engine_wrote", "got"]),
        "gateway": (via, ["sent", "request_to_gateway", "arrive", "upstream_write",
                          "request_to_engine", "engine_wrote", "read", "send0", "gateway_wrote",
                          "send1", "got"]),
    }  # fmt: skip
    for path, (traces, chain) in chains.items():
        for a, b in zip(chain, chain[1:], strict=False):
            gaps = [
                (t.hops.get(b, t.got if b == "got" else 0) - t.hops.get(a, t.sent)) * 1000
                for t in traces
                if (a == "sent" or a in t.hops) and (b == "got" or b in t.hops)
            ]
            if gaps:
                print(f"  {path:<8}{a + ' -> ' + b:<34}p50 {pct(gaps, .5):7.3f}  "
                      f"p90 {pct(gaps, .9):7.3f}  max {max(gaps):7.3f}  "
                      f"(n={len(gaps)})")  # fmt: skip

    def connects(traces: list[Trace], hop: str) -> int:
        return sum(hop in t.hops for t in traces)

    print(
        f"  new connections: client to engine {connects(direct, 'connect_to_engine')}; client to "
        f"gateway {connects(via, 'connect_to_gateway')}, gateway to engine "
        f"{connects(via, 'connect_to_engine')} (of {len(direct)} and {len(via)} requests)"
    )
    d = [(t.got - t.sent) * 1000 for t in direct]
    g = [(t.got - t.sent) * 1000 for t in via]
    added = [b - a for a, b in zip(d, g, strict=False)]
    print(f"  TTFT direct p50 {pct(d, .5):.2f} p99 {pct(d, .99):.2f}; gateway p50 {pct(g, .5):.2f} "
          f"p99 {pct(g, .99):.2f}; added p50 {pct(g, .5) - pct(d, .5):+.2f} "
          f"p99 {pct(g, .99) - pct(d, .99):+.2f}; paired added p50 {statistics.median(added):+.2f} "
          f"p90 {pct(added, .9):+.2f}")  # fmt: skip


async def phases(
    engine_url: str, gateway_url: str, args: argparse.Namespace, wire: Wire, hooks: Path
) -> None:
    """Fresh, then after a burst: lone requests alternating direct / gateway, then report."""
    path = "/v1/chat/completions"
    for name in ("fresh gateway", "after a 200-stream burst"):
        if name.startswith("after"):
            await burst(gateway_url + path, args.burst_requests, args.burst_streams)
            await asyncio.sleep(2.0)
        wire.start()
        hooks.write_text("")
        direct: list[Trace] = []
        via: list[Trace] = []
        for _ in range(args.requests // 10):
            await lone(engine_url + path, 10, direct)
            await lone(gateway_url + path, 10, via)
        stamps = wire.stop()
        attach(direct, [s for s in stamps if s[1].endswith("engine") or s[1] == "engine_wrote"])
        attach(via, stamps + read_hooks(hooks))
        report(name, direct, via)


# ---- the 200-stream burst, traced per request -------------------------------------------

BURST_CHAINS = {
    "direct": ["sent", "c_conn", "c_headers_sent", "c_head", "got"],
    "gateway": ["sent", "c_conn", "c_headers_sent", "arrive", "admitted", "connect0",
                "connect1", "upstream_write", "upstream_head", "read", "send0", "send1", "got"],
}  # fmt: skip
ENGINE_HOPS = ("engine_got", "engine_wrote")  # the scripted engine's own stamps


def client_tracing(stamps: dict[str, dict[str, float]]) -> aiohttp.TraceConfig:
    """aiohttp's request hooks, stamping into ``stamps[x-trace-id][hop]`` (wall clock)."""
    config = aiohttp.TraceConfig()

    def hook(hop: str, *, first: bool = False) -> Callable[..., Awaitable[None]]:
        async def on(session: object, ctx: SimpleNamespace, params: object) -> None:
            if first:
                ctx.tid = params.headers.get("x-trace-id", "")  # type: ignore[attr-defined]
            tid = getattr(ctx, "tid", "")
            if tid:
                stamps.setdefault(tid, {}).setdefault(hop, time.time())

        return on

    config.on_request_start.append(hook("c_start", first=True))
    config.on_connection_create_start.append(hook("c_connect0"))
    config.on_connection_create_end.append(hook("c_conn"))
    config.on_connection_reuseconn.append(hook("c_conn"))
    config.on_request_headers_sent.append(hook("c_headers_sent"))
    config.on_request_end.append(hook("c_head"))
    return config


def schedstat(pids: list[int]) -> tuple[float, float]:
    """(CPU seconds run, seconds spent runnable but waiting for a CPU): all threads of pids."""
    run = wait = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                r, w, _ = (task / "schedstat").read_text().split()
            except (OSError, ValueError):
                continue
            run += int(r)
            wait += int(w)
    return run / 1e9, wait / 1e9


async def sample_sched(
    pids: dict[str, Callable[[], list[int]]],
    out: list[tuple[float, dict[str, tuple[float, float]]]],
    every_s: float = 0.1,
) -> None:
    """Every ``every_s``: (wall time, each group's schedstat), until cancelled."""
    groups = {k: f() for k, f in pids.items()}  # the processes do not change during a burst
    while True:
        out.append((time.time(), {k: schedstat(p) for k, p in groups.items()}))
        await asyncio.sleep(every_s)


def window(
    samples: list[tuple[float, dict[str, tuple[float, float]]]], start: float, end: float
) -> dict[str, tuple[float, float]]:
    """Each group's (CPU run, wait for a CPU) between the samples nearest ``start`` and ``end``."""
    first = min(samples, key=lambda s: abs(s[0] - start))[1]
    last = min(samples, key=lambda s: abs(s[0] - end))[1]
    return {k: (last[k][0] - first[k][0], last[k][1] - first[k][1]) for k in first}


async def traced_burst(
    url: str, bodies: list[dict[str, object]], concurrency: int, tag: str
) -> dict[str, dict[str, float]]:
    """One burst like the bench's rounds; per request id its client-side stamps."""
    stamps: dict[str, dict[str, float]] = {}
    queue = list(enumerate(bodies))[::-1]
    connector = aiohttp.TCPConnector(limit=concurrency + 8)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=60)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, trace_configs=[client_tracing(stamps)]
    ) as session:

        async def worker() -> None:
            while queue:
                n, body = queue.pop()
                tid = f"{tag}-{n}"
                record = RequestRecord(sent_at=time.time())
                stamps.setdefault(tid, {})["sent"] = record.sent_at
                await stream_request(session, url, body, record, headers={"x-trace-id": tid},
                                     timeout_s=600, clock=time.time)  # fmt: skip
                if record.outcome is Outcome.OK and record.first_token_at is not None:
                    stamps[tid]["got"] = record.first_token_at
                else:
                    stamps[tid]["failed"] = 1.0

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return stamps


def collections(path: Path) -> list[tuple[int, float, float]]:
    """The gateway's garbage collections: (generation, start, seconds)."""
    out = []
    for line in path.read_text().splitlines():
        hop, ns, *rest = line.split()
        if hop.startswith("gc") and rest:
            out.append((int(hop[2:]), int(ns) / 1e9, float(rest[0])))
    return out


def per_id(*paths: Path) -> dict[str, dict[str, float]]:
    """``hop ns id`` lines (the gateway's hooks, the scripted engine) by request id."""
    out: dict[str, dict[str, float]] = {}
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            hop, ns, *rest = line.split()
            if rest and not hop.startswith("gc"):
                out.setdefault(rest[0], {}).setdefault(hop, int(ns) / 1e9)
    return out


def _gaps(values: list[float]) -> str:
    return (
        f"{pct(values, 0.5):8.1f}{pct(values, 0.9):8.1f}{pct(values, 0.99):8.1f}" if values else ""
    )


def burst_report(path: str, reqs: list[dict[str, float]], chain: list[str], tail_q: float) -> None:
    """Each hop's p50/p90/p99 over all requests, and its median in the TTFT tail."""
    ok = [r for r in reqs if "got" in r]
    ttft = sorted((r["got"] - r["sent"]) * 1000 for r in ok)
    cut = pct(ttft, tail_q)
    tail = [r for r in ok if (r["got"] - r["sent"]) * 1000 >= cut]
    print(f"\n== {path}: {len(ok)} requests; TTFT ms p50 {pct(ttft, .5):.0f} p90 "
          f"{pct(ttft, .9):.0f} p99 {pct(ttft, .99):.0f}; tail = the {len(tail)} with TTFT >= "
          f"p{tail_q * 100:.0f} ({cut:.0f} ms) ==")  # fmt: skip
    print(f"  {'hop':<34}{'p50':>8}{'p90':>8}{'p99':>8}{'tail med':>10}{'tail max':>10}  n")
    for a, b in zip(chain, chain[1:], strict=False):
        gaps = [(r[b] - r[a]) * 1000 for r in ok if a in r and b in r]
        tgaps = [(r[b] - r[a]) * 1000 for r in tail if a in r and b in r]
        if a == "admitted" and b == "connect0":  # reused connections: admitted -> written
            print(
                f"  {'(reused: admitted -> upstream_write)':<34}"
                + _gaps([(r["upstream_write"] - r[a]) * 1000 for r in ok if "connect0" not in r])
            )
        if gaps:
            tmed = f"{statistics.median(tgaps):10.1f}{max(tgaps):10.1f}" if tgaps else " " * 20
            print(f"  {a + ' -> ' + b:<34}{pct(gaps, .5):8.1f}{pct(gaps, .9):8.1f}"
                  f"{pct(gaps, .99):8.1f}{tmed}  {len(gaps)}")  # fmt: skip
    # where in the burst: first wave (sent at the start) or refills (sent as a stream ended)
    for name, group in (("all", ok), ("tail", tail)):
        start = [r for r in group if r["sent"] - r["burst0"] < 0.05]
        at = statistics.median((r["sent"] - r["burst0"]) * 1000 for r in group)
        print(f"  {name}: {len(start)} of {len(group)} sent in the burst's first 50 ms; "
              f"median sent at +{at:.0f} ms")  # fmt: skip
    # the first wave (the requests sent together at the burst's start): when each of them
    # reached each hop, ms after the burst began
    wave = [r for r in ok if r["sent"] - r["burst0"] < 0.05]
    print(f"  first wave ({len(wave)} requests sent in the first 50 ms): ms after the burst began")
    print(f"  {'hop':<18}{'first':>8}{'p50':>8}{'last':>8}")
    for hop in ["accept", *chain]:
        at = sorted((r[hop] - r["burst0"]) * 1000 for r in wave if hop in r)
        if at:
            print(f"  {hop:<18}{at[0]:8.1f}{pct(at, 0.5):8.1f}{at[-1]:8.1f}")


async def bursts(
    engine_url: str, gateway_url: str, args: argparse.Namespace, hooks: Path, engine_log: Path,
    pids: dict[str, Callable[[], list[int]]],
) -> None:  # fmt: skip
    """Rounds of direct and gateway bursts (rotating order); then the per-hop tables."""
    path = "/v1/chat/completions"
    urls = {"direct": engine_url + path, "gateway": gateway_url + path}
    reqs: dict[str, list[dict[str, float]]] = {"direct": [], "gateway": []}
    sched: dict[str, list[dict[str, tuple[float, float]]]] = {"direct": [], "gateway": []}
    wave: dict[str, list[dict[str, tuple[float, float]]]] = {"direct": [], "gateway": []}
    for i in range(args.burst):
        for name in ["direct", "gateway"] if i % 2 == 0 else ["gateway", "direct"]:
            warm = send.bodies(16, 32, 8, 50 + i)
            await send.drive(urls[name], warm, 16)  # as the bench: 16 warm connections
            await asyncio.sleep(args.burst_pause)
            hooks.write_text("")
            engine_log.write_text("")
            work = send.bodies(args.burst_requests, 32, args.burst_tokens, 1000 * i + len(name))
            before = {k: schedstat(f()) for k, f in pids.items()}
            samples: list[tuple[float, dict[str, tuple[float, float]]]] = []
            sampler = asyncio.create_task(sample_sched(pids, samples))
            stamps = await traced_burst(urls[name], work, args.burst_streams, f"{name}{i}")
            sampler.cancel()
            after = {k: schedstat(f()) for k, f in pids.items()}
            sched[name].append({k: (after[k][0] - before[k][0], after[k][1] - before[k][1])
                                for k in pids})  # fmt: skip
            server = per_id(hooks, engine_log)
            burst0 = min(s["sent"] for s in stamps.values())
            for tid, s in stamps.items():
                reqs[name].append({**server.get(tid, {}), **s, "burst0": burst0})
            ok = [s for s in stamps.values() if "got" in s]
            ttft = sorted((s["got"] - s["sent"]) * 1000 for s in ok)
            wave_end = max(s["got"] for s in ok if s["sent"] - burst0 < 0.05)
            wave[name].append(window(samples, burst0, wave_end))
            if name == "gateway":
                gcs = collections(hooks)
                in_wave = [g for g in gcs if burst0 <= g[1] <= wave_end]
                per_gen = ", ".join(
                    f"{gen}: {sum(g[0] == gen for g in gcs)}, "
                    f"{sum(g[2] for g in gcs if g[0] == gen):.3f}"
                    for gen in (0, 1, 2)
                )
                longest = max((g[2] for g in in_wave), default=0) * 1000
                print(f"  gateway garbage collections in the round (generation: count, seconds): "
                      f"{per_gen}; in the first wave {len(in_wave)}, "
                      f"{sum(g[2] for g in in_wave):.3f} s, longest {longest:.1f} ms")  # fmt: skip
            print(
                f"  first wave: {(wave_end - burst0) * 1000:.0f} ms until its last first "
                "token; in it, CPU run / wait for a CPU s: "
                + ", ".join(f"{k} {r:.2f}/{w:.2f}" for k, (r, w) in wave[name][-1].items())
            )
            print(f"round {i + 1} {name}: {len(ok)}/{len(stamps)} ok, TTFT p50 "
                  f"{pct(ttft, .5):.0f} p99 {pct(ttft, .99):.0f} ms; CPU run / wait for a CPU s: "
                  + ", ".join(f"{k} {r:.2f}/{w:.2f}" for k, (r, w) in sched[name][-1].items()),
                  flush=True)  # fmt: skip
    for name in ("direct", "gateway"):
        chain = BURST_CHAINS[name]
        if any("engine_got" in r for r in reqs[name]):  # the scripted engine's own stamps
            at = chain.index("upstream_head" if name == "gateway" else "c_head")
            chain = [*chain[:at], "engine_got", chain[at], "engine_wrote", *chain[at + 1 :]]
        burst_report(name, reqs[name], chain, args.tail)
        totals = {k: (sum(s[k][0] for s in sched[name]), sum(s[k][1] for s in sched[name]))
                  for k in pids}  # fmt: skip
        print("  per round, CPU run / waiting for a CPU (s, median): " + ", ".join(
            f"{k} {statistics.median(s[k][0] for s in sched[name]):.2f}/"
            f"{statistics.median(s[k][1] for s in sched[name]):.2f}" for k in totals))  # fmt: skip
        print("  first wave, CPU run / waiting for a CPU (s, median): " + ", ".join(
            f"{k} {statistics.median(s[k][0] for s in wave[name]):.3f}/"
            f"{statistics.median(s[k][1] for s in wave[name]):.3f}" for k in totals))  # fmt: skip
    out = Path(args.save) if args.save else None
    if out:
        out.write_text(json.dumps({"requests": reqs, "sched": sched, "wave": wave}))
        print(f"\nper-request stamps: {out}")


# ---- the disconnect drain, traced ----------------------------------------------------------


async def drains(engine_url: str, gateway_url: str, args: argparse.Namespace, hooks: Path) -> None:
    """The bench's disconnect-drain trial, with the gateway's view of each one.

    A client streams a 4000-token completion and leaves after 10 tokens. Tokens the engine made
    beyond the 10 the client took are split by where they were when it left: already read by
    the gateway (made before the client left: they sat in buffers on the way to a client that
    had not read them yet), read by the gateway after the client left but before the gateway
    closed the engine's connection (the gateway's reaction), and the rest (in flight from the
    engine, or made before vLLM noticed the closed connection).
    """
    import httpx  # noqa: PLC0415
    from _gateway_bench_send import USAGE as BENCH_USAGE  # noqa: PLC0415
    from gateway_bench import engine_generated  # noqa: PLC0415

    request = {"model": "tiny-llama", "prompt": [100 + i for i in range(8)], "max_tokens": 4000,
               "ignore_eos": True, "stream": True, "stream_options": BENCH_USAGE}  # fmt: skip
    rows: list[dict[str, float | str]] = []
    async with httpx.AsyncClient(timeout=120) as client:
        for i in range(args.drain):
            for name, base in (("direct", engine_url), ("gateway", gateway_url)):
                tid = f"drain-{name}{i}"
                hooks.write_text("")
                before = await engine_generated(client, engine_url)
                received = 0
                t10 = 0.0
                url = f"{base}/v1/completions"
                async with client.stream(
                    "POST", url, json=request, headers={"x-trace-id": tid}
                ) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: {"):
                            received = json.loads(line[6:])["usage"]["completion_tokens"]
                            if received >= 10:
                                t10 = time.time()
                                break
                closed = time.time()
                generated = await engine_generated(client, engine_url) - before
                await asyncio.sleep(1.0)  # the gateway may still be reading what it had buffered
                row: dict[str, float | str] = {
                    "path": name, "extra": generated - received, "received": received,
                    "t10": t10, "closed": closed,
                }  # fmt: skip
                tokens: list[tuple[float, int]] = []
                sent: list[tuple[float, int]] = []
                for line in hooks.read_text().splitlines():
                    hop, ns, *rest = line.split()
                    if rest and rest[0] == tid:
                        if hop in ("tokens", "sent"):
                            (tokens if hop == "tokens" else sent).append(
                                (int(ns) / 1e9, int(rest[1]))
                            )
                        else:
                            row.setdefault(hop, int(ns) / 1e9)
                if tokens:
                    at_close = _read_by(tokens, closed)
                    row["sent_by_close"] = _read_by(sent, closed)  # written to the client by then
                    at_upstream = _read_by(tokens, float(row.get("upstream_close", closed)))
                    spread = tokens[-1][0] - tokens[0][0]  # first to last token read, seconds
                    row.update(buffered=at_close - received, gateway=at_upstream - at_close,
                               after_close=generated - at_upstream, spread=spread)  # fmt: skip
                rows.append(row)
                print(_drain_line(row), flush=True)
    for name in ("direct", "gateway"):
        extra = [float(r["extra"]) for r in rows if r["path"] == name]
        print(f"{name}: extra tokens median {statistics.median(extra):.0f}; all {extra}")
    if args.save:
        Path(args.save).write_text(json.dumps(rows))


def _read_by(tokens: list[tuple[float, int]], t: float) -> int:
    """The highest token count the gateway had read from the engine by ``t``."""
    return max([n for at, n in tokens if at <= t], default=0)


def _drain_line(row: dict[str, float | str]) -> str:
    ms = {k: (float(row[k]) - float(row["closed"])) * 1000
          for k in ("disconnect", "upstream_close") if k in row}  # fmt: skip
    text = (f"{row['path']:<8} extra {row['extra']:5.0f}  (client read 10th token -> closed "
            f"{(float(row['closed']) - float(row['t10'])) * 1000:6.1f} ms")  # fmt: skip
    if "buffered" in row:
        first = float(row["upstream_head"]) - float(row["upstream_write"])
        text += (f"; the engine's first byte came {first:.2f} s after the request, all its "
                 f"tokens within {float(row['spread']) * 1000:.0f} ms; the gateway had read "
                 f"{float(row['buffered']) + float(row['received']):.0f} (and written "
                 f"{row.get('sent_by_close', 0)} to the client) when the client left, "
                 f"saw the disconnect {ms.get('disconnect', float('nan')):+.1f} ms and closed the "
                 f"engine's connection {ms.get('upstream_close', float('nan')):+.1f} ms after; "
                 f"extra = {row['buffered']} made before the client left + {row['gateway']} read "
                 f"while the gateway reacted + {row['after_close']} after it closed)")  # fmt: skip
    return text + ")" if "buffered" not in row else text


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=60, help="per path and phase")
    parser.add_argument("--burst-streams", type=int, default=200)
    parser.add_argument("--burst-requests", type=int, default=400)
    parser.add_argument("--code", type=Path, help="run the gateway from DIR/bot instead")
    parser.add_argument("--fake-engine", action="store_true")
    parser.add_argument("--engine-url", help="use this running engine instead of starting one")
    parser.add_argument("--engine-pid", type=int, help="that engine's pid (for its CPU waits)")
    parser.add_argument(
        "--burst",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="trace ROUNDS of 200-stream bursts per path, request by request, "
        "instead of lone streams",
    )
    parser.add_argument("--burst-tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument(
        "--burst-pause", type=float, default=3.0, help="seconds idle before each traced burst"
    )
    parser.add_argument(
        "--tail",
        type=float,
        default=0.95,
        help="the TTFT quantile from which a request is in the tail",
    )
    parser.add_argument(
        "--drain",
        type=int,
        default=0,
        metavar="TRIALS",
        help="trace the disconnect drain (TRIALS per path) instead",
    )
    parser.add_argument(
        "--gateway-nice", type=int, help="run the gateway at this nice value (root for < 0)"
    )
    parser.add_argument("--save", help="write the burst's per-request stamps here (JSON)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ruleloop-gw-trace-"))
    port = free_port()
    manager = EngineManager(state_dir=tmp)
    engine_pid = args.engine_pid or 0
    if args.engine_url:
        engine_url = args.engine_url.rstrip("/")
        port = int(engine_url.rsplit(":", 1)[1])
    elif args.fake_engine:
        script = procs.ROOT / "bench" / "_trace_engine.py"
        engine = subprocess.Popen(  # noqa: S603
            [sys.executable, str(script), str(port)],
            env=dict(os.environ, RULELOOP_ENGINE_TRACE=str(tmp / "engine.log")),
        )
        engine_url = f"http://127.0.0.1:{port}"
        engine_pid = engine.pid
    else:
        info = manager.start(port=port, flags=["--enforce-eager", "--max-num-seqs", "256"])
        engine_url = info.base_url
        engine_pid = info.pid
    hooks = tmp / "hooks.log"
    gw_port = free_port()
    prelude = f"import sys; sys.path.insert(0, {str(args.code)!r}); " if args.code else ""
    path = os.pathsep.join([str(procs.ROOT / "bench"), str(procs.ROOT)])
    env = dict(os.environ, RULELOOP_GATEWAY_TRACE=str(hooks), PYTHONPATH=path)
    engine_log = tmp / "engine.log"
    prelude += "import _gateway_trace_hooks; from bot.app.cli import main; main()"
    gateway = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", prelude,
         "gateway", "--upstream", engine_url, "--listen", f"127.0.0.1:{gw_port}",
         "--max-inflight-tokens", "10000000"],
        cwd=tmp, env=env, stdout=(tmp / "gateway.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        gateway_url = f"http://127.0.0.1:{gw_port}"
        procs.wait_ready(f"{gateway_url}/v1/models", gateway, "the gateway")
        if args.gateway_nice is not None:
            os.setpriority(os.PRIO_PROCESS, gateway.pid, args.gateway_nice)
        if args.drain:
            loop.run(drains(engine_url, gateway_url, args, hooks))
        elif args.burst:
            pids = {
                "engine": lambda: [engine_pid, *procs.children(engine_pid)] if engine_pid else [],
                "gateway": lambda: [gateway.pid],
                "client": lambda: [os.getpid()],
            }
            loop.run(bursts(engine_url, gateway_url, args, hooks, engine_log, pids))
        else:
            wire = Wire(port, gw_port, tmp / "wire.txt")
            loop.run(phases(engine_url, gateway_url, args, wire, hooks))
    finally:
        procs.stop([gateway])
        if args.fake_engine:
            procs.stop([engine])
        elif not args.engine_url:
            manager.stop(port)


if __name__ == "__main__":
    main()
