"""Gateway overhead: the same streaming load direct to vLLM, through the gateway, through LiteLLM.

    python bench/gateway_bench.py [--concurrency 200] [--requests 400] [--rounds 3] [--no-litellm]

Starts its own engine (EngineManager), the gateway (`ruleloop gateway`, its own process) and
LiteLLM's proxy (its own venv, --litellm) in front of it, then runs the same chat workload
against each, rotating the order every round so drift on this shared 2-core box hits all
alike. Per path: TTFT p50/p99, TPOT p99, streamed tokens/s, and CPU seconds per 1,000 streamed
tokens of the proxy process (from /proc). Also: tokens the engine generated after a client left
mid-stream, direct vs through the gateway. Results: bench/results/gateway_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx

from bot.canary.client import Outcome, RequestRecord, stream_request
from bot.canary.report import summarize
from bot.engine.process import EngineManager, free_port
from bot.probes.exposition import Exposition
from bot.probes.vllm_metrics import GENERATION_TOKENS, RUNNING, WAITING, gauge

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
LITELLM = "/work/venvs/litellm/bin/litellm"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its live children (from /proc)."""
    total = 0.0
    for p in [pid, *_children(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def _children(pid: int) -> list[int]:
    try:
        kids = [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return kids + [g for k in kids for g in _children(k)]


def start_gateway(upstream: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    """`ruleloop gateway` in its own process, with a budget large enough never to refuse."""
    argv = [sys.executable, "-c", "from bot.cli import main; main()", "gateway",
            "--upstream", upstream, "--listen", f"127.0.0.1:{port}",
            "--max-inflight-tokens", "10000000", "--default-timeout", "600s"]  # fmt: skip
    return subprocess.Popen(argv, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)  # noqa: S603


def start_litellm(litellm: str, upstream: str, port: int, tmp: Path) -> subprocess.Popen[bytes]:
    """LiteLLM's proxy (own venv) with one model: hosted_vllm/tiny-llama at the engine."""
    config = tmp / "litellm.yaml"
    config.write_text(
        "model_list:\n  - model_name: tiny-llama\n    litellm_params:\n"
        f"      model: hosted_vllm/tiny-llama\n      api_base: {upstream}/v1\n"
    )
    env = dict(os.environ, LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY="true",
               LITELLM_LOG="ERROR", LITELLM_TELEMETRY="False")  # fmt: skip
    argv = [litellm, "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
            "--num_workers", "1"]  # fmt: skip
    log = (tmp / "litellm.log").open("wb")
    return subprocess.Popen(argv, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603


def wait_ready(url: str, proc: subprocess.Popen[bytes], name: str, timeout_s: float = 300) -> None:
    """Poll ``url`` until it answers 200; fail if the process dies first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with code {proc.returncode} before serving")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{name} did not serve {url} within {timeout_s:.0f} s")


def bodies(count: int, words: int, output: int, seed: int) -> list[dict[str, object]]:
    """Chat requests with distinct random prompts (no prefix-cache hits across runs)."""
    rng = random.Random(seed)
    return [
        {"model": "tiny-llama", "max_tokens": output, "ignore_eos": True, "temperature": 0.0,
         "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
         "messages": [{"role": "user",
                       "content": " ".join(rng.choice(string.ascii_lowercase) for _ in range(words))}]}
        for _ in range(count)
    ]  # fmt: skip


async def drive(url: str, requests: list[dict[str, object]], concurrency: int) -> tuple[list[RequestRecord], float]:
    """Send every request with ``concurrency`` streams in flight; return records and wall time."""
    records: list[RequestRecord] = []
    queue = list(reversed(requests))
    connector = aiohttp.TCPConnector(limit=concurrency + 8)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            while queue:
                record = RequestRecord(sent_at=time.perf_counter())
                records.append(record)
                await stream_request(session, url, queue.pop(), record, timeout_s=600)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return records, time.perf_counter() - started


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


async def measure(name: str, base: str, pid: int | None, engine_url: str, args: argparse.Namespace, seed: int) -> dict[str, float]:  # fmt: skip
    """One load run against one path; the numbers the table compares."""
    url = f"{base}/v1/chat/completions"
    await drive(url, bodies(16, args.prompt_words, 8, seed + 99), 16)  # warm connections
    async with httpx.AsyncClient(timeout=30) as client:
        before = await engine_generated(client, engine_url)
        cpu0 = cpu_seconds(pid) if pid else 0.0
        records, wall = await drive(url, bodies(args.requests, args.prompt_words, args.output_tokens, seed), args.concurrency)
        cpu = (cpu_seconds(pid) - cpu0) if pid else 0.0
        generated = await engine_generated(client, engine_url) - before
    ok = [r for r in records if r.outcome is Outcome.OK]
    if len(ok) < len(records):
        errors = {r.error for r in records if r.outcome is not Outcome.OK}
        print(f"    {name}: {len(records) - len(ok)} requests failed: {sorted(errors)[:3]}", flush=True)
    tokens = sum(r.output_tokens for r in records)
    ttft = summarize([r.ttft_s * 1000 for r in ok if r.ttft_s is not None])
    tpot = summarize([r.tpot_s * 1000 for r in ok if r.tpot_s is not None])
    return {
        "ttft_p50": ttft["p50"], "ttft_p99": ttft["p99"], "tpot_p99": tpot["p99"],
        "tokens_per_s": tokens / wall, "tokens": tokens, "engine_tokens": generated,
        "ok": len(ok), "wall_s": wall, "proxy_cpu_s": cpu,
        "proxy_cpu_per_1k_tokens": cpu / tokens * 1000 if tokens else float("nan"),
    }  # type: ignore[dict-item]  # fmt: skip


async def disconnect_drain(base: str, engine_url: str, trials: int) -> list[float]:
    """Tokens the engine generated after a client left mid-stream (10 tokens in), per trial."""
    extra = []
    request = {"model": "tiny-llama", "prompt": [100 + i for i in range(8)], "max_tokens": 4000,
               "ignore_eos": True, "stream": True,
               "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip
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


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    """Median of each number across rounds."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


async def run_all(paths: dict[str, tuple[str, int | None]], engine_url: str, args: argparse.Namespace) -> dict[str, object]:  # fmt: skip
    """Rounds of every path in rotating order, then the disconnect-drain comparison."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
    names = list(paths)
    for i in range(args.rounds):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            base, pid = paths[name]
            print(f"round {i + 1}/{args.rounds}: {name} ({args.concurrency} streams) ...", flush=True)
            result = await measure(name, base, pid, engine_url, args, seed=1000 * i + names.index(name))
            runs[name].append(result)
            print("   ", {k: round(v, 2) for k, v in result.items()}, flush=True)
    drain = {}
    for name in ("direct", "gateway"):
        print(f"disconnect drain: {name} ({args.drain_trials} trials) ...", flush=True)
        drain[name] = await disconnect_drain(paths[name][0], engine_url, args.drain_trials)
        print("    extra tokens after disconnect:", drain[name], flush=True)
    return {"runs": runs, "median": {n: median_of(r) for n, r in runs.items()}, "drain": drain}


def print_table(result: dict[str, object], args: argparse.Namespace) -> None:
    """The comparison table: each path against direct."""
    median: dict[str, dict[str, float]] = result["median"]  # type: ignore[assignment]
    direct = median["direct"]
    print(f"\n{args.concurrency} concurrent streams, {args.requests} chat requests, {args.prompt_words}-word prompt, "
          f"{args.output_tokens} output tokens, median of {args.rounds} rounds")  # fmt: skip
    head = f"{'path':<10}{'TTFT p50':>10}{'TTFT p99':>10}{'ΔTTFT p99':>11}{'TPOT p99':>10}{'tok/s':>9}{'tok/s ratio':>12}{'proxy CPU s/1k tok':>20}"
    print(head)
    print("-" * len(head))
    for name, m in median.items():
        print(f"{name:<10}{m['ttft_p50']:>10.1f}{m['ttft_p99']:>10.1f}{m['ttft_p99'] - direct['ttft_p99']:>+11.1f}"
              f"{m['tpot_p99']:>10.1f}{m['tokens_per_s']:>9.0f}{m['tokens_per_s'] / direct['tokens_per_s']:>12.3f}"
              f"{(m['proxy_cpu_per_1k_tokens'] if name != 'direct' else float('nan')):>20.3f}")  # fmt: skip
    drain: dict[str, list[float]] = result["drain"]  # type: ignore[assignment]
    print("\nextra tokens generated after a client left mid-stream (median; all trials):")
    for name, values in drain.items():
        print(f"  {name:<10}{statistics.median(values):>6.0f}   {values}")


def main() -> None:
    """Start engine and proxies, run the rounds, print the table, save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--prompt-words", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--drain-trials", type=int, default=5)
    parser.add_argument("--litellm", default=LITELLM, help="LiteLLM's CLI in its own venv")
    parser.add_argument("--no-litellm", action="store_true")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="ruleloop-gw-bench-"))
    manager = EngineManager(state_dir=tmp)
    port = free_port()
    print(f"starting vLLM on port {port} ...", flush=True)
    info = manager.start(port=port, flags=["--enforce-eager", "--max-num-seqs", "256"], on_progress=print)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        gw_port = free_port()
        gateway = start_gateway(info.base_url, gw_port, tmp / "gateway.log")
        procs.append(gateway)
        paths: dict[str, tuple[str, int | None]] = {"direct": (info.base_url, None)}
        paths["gateway"] = (f"http://127.0.0.1:{gw_port}", gateway.pid)
        wait_ready(f"{paths['gateway'][0]}/v1/models", gateway, "the gateway")
        use_litellm = not args.no_litellm and Path(args.litellm).exists()
        if use_litellm:
            ll_port = free_port()
            print("starting LiteLLM proxy ...", flush=True)
            litellm = start_litellm(args.litellm, info.base_url, ll_port, tmp)
            procs.append(litellm)
            paths["litellm"] = (f"http://127.0.0.1:{ll_port}", litellm.pid)
            wait_ready(f"{paths['litellm'][0]}/v1/models", litellm, "LiteLLM")
        elif not args.no_litellm:
            print(f"LiteLLM not found at {args.litellm}; skipping the peer", flush=True)
        try:
            import uvloop

            result = uvloop.run(run_all(paths, info.base_url, args))
        except ImportError:
            result = asyncio.run(run_all(paths, info.base_url, args))
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        manager.stop(port)
    print_table(result, args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gateway_bench.json").write_text(json.dumps({"args": vars(args), **result}, indent=2))


if __name__ == "__main__":
    main()
