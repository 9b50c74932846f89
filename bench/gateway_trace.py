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
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import _gateway_bench_procs as procs
import aiohttp

from bot import loop
from bot.canary.client import Outcome, RequestRecord, stream_request
from bot.engine.process import EngineManager, free_port

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
    """(time, hop) lines the gateway's hooks wrote."""
    out = []
    for line in path.read_text().splitlines():
        hop, ns = line.split()
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
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ruleloop-gw-trace-"))
    port = free_port()
    manager = EngineManager(state_dir=tmp)
    if args.engine_url:
        engine_url = args.engine_url.rstrip("/")
        port = int(engine_url.rsplit(":", 1)[1])
    elif args.fake_engine:
        script = procs.ROOT / "bench" / "_trace_engine.py"
        engine = subprocess.Popen([sys.executable, str(script), str(port)])  # noqa: S603
        engine_url = f"http://127.0.0.1:{port}"
    else:
        info = manager.start(port=port, flags=["--enforce-eager", "--max-num-seqs", "256"])
        engine_url = info.base_url
    hooks = tmp / "hooks.log"
    gw_port = free_port()
    prelude = f"import sys; sys.path.insert(0, {str(args.code)!r}); " if args.code else ""
    path = os.pathsep.join([str(procs.ROOT / "bench"), str(procs.ROOT)])
    env = dict(os.environ, RULELOOP_GATEWAY_TRACE=str(hooks), PYTHONPATH=path)
    prelude += "import _gateway_trace_hooks; from bot.cli import main; main()"
    gateway = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", prelude,
         "gateway", "--upstream", engine_url, "--listen", f"127.0.0.1:{gw_port}",
         "--max-inflight-tokens", "10000000"],
        cwd=tmp, env=env, stdout=(tmp / "gateway.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        gateway_url = f"http://127.0.0.1:{gw_port}"
        procs.wait_ready(f"{gateway_url}/v1/models", gateway, "the gateway")
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
