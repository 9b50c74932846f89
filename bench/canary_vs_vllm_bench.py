"""Canary vs vLLM's own `vllm bench serve`: same workload, same engine, one run.

    python bench/canary_vs_vllm_bench.py [--concurrency 150] [--requests 300] [--rounds 5]
                                         [--intervals 0.5,1,2] [--shape FILE]

Starts a local engine, then runs the clients in a rotating order (A B C, B C A, ...) so that
drift on this noisy 2-core box hits each alike: the canary at each in-flight /metrics sampling
interval (every sample makes vLLM's API server render its page: the observer effect), the
canary without sampling, the canary replaying a workload shape (``--workload``, sampled at the
default 2 s), and the peer. The shape is by default the fixed workload's own lengths as a
shape (buckets (L-1, L]: every prompt and output exactly as long as the fixed ones; arrivals
far faster than the engine, so the concurrency cap paces them as in the fixed rounds): the
replay's planning and pacing priced against the fixed canary's; ``--shape FILE`` replays a
captured one instead. Every run gets its own ``--seed`` (canary and peer alike), so no run is
served from an earlier run's identical prompts in the engine's prefix cache. The engine runs
without its prefix cache (``--prefix-caching`` keeps it): the peer's random dataset builds each
prompt from consecutive token ids at a random start, and on the test model's 320-token
vocabulary about 40 % of 300 prompts repeat an earlier one, so the cache served about half the
peer's prompt tokens and none of the canary's. Reports the median over rounds of TTFT p50/p99,
TPOT p50/p99, client CPU seconds per 1,000 streamed tokens (load phase only) and the share of
prompt tokens the prefix cache served, and each client's ratio to the peer. Results land in
bench/results/canary_vs_vllm_bench.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import httpx

from bot.engine.process import EngineManager, free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PEER = "vllm bench serve"


# The shape round's arrivals: far more requests/s than the engine serves, so the concurrency
# cap paces them, as the fixed rounds' streams are paced.
SHAPE_RATE = 10_000.0


def exact_shape(args: argparse.Namespace) -> str:
    """The fixed workload as a shape file (YAML): every prompt and output exactly as long."""

    def exactly(n: int) -> str:
        return f"{{count: {args.requests}, buckets: {{'{n - 1}': 0.0, '{n}': 1.0}}}}"

    return (
        f"version: 1\nsource: bench fixed workload as a shape\n"
        f"captured_at: '2026-12-01T00:00:00Z'\napi: completions\n"
        f"prompt_tokens: {exactly(args.prompt_length)}\n"
        f"output_tokens: {exactly(args.output_length)}\n"
        f"arrivals: {{request_rate: {SHAPE_RATE}}}\n"
    )


def prefix_cache_counts(base_url: str) -> tuple[float, float]:
    """The engine's prefix-cache (hit, queried) prompt tokens so far, from its /metrics."""
    counts = {"vllm:prefix_cache_hits_total": 0.0, "vllm:prefix_cache_queries_total": 0.0}
    for line in httpx.get(f"{base_url}/metrics", timeout=30).text.splitlines():
        name = line.split("{", 1)[0]
        if name in counts:
            counts[name] += float(line.rsplit(" ", 1)[1])
    return counts["vllm:prefix_cache_hits_total"], counts["vllm:prefix_cache_queries_total"]


def with_cache_share(base_url: str, run: Callable[[], dict[str, float]]) -> dict[str, float]:
    """``run``'s numbers plus the share of its prompt tokens the prefix cache served (warmup
    included): a client whose prompts repeat does less prefill work for the same lengths."""
    hits0, queries0 = prefix_cache_counts(base_url)
    numbers = run()
    hits, queries = prefix_cache_counts(base_url)
    numbers["prefix_cache_hit_share"] = (hits - hits0) / max(queries - queries0, 1.0)
    return numbers


def run_canary(
    base_url: str,
    args: argparse.Namespace,
    out: Path,
    *,
    interval: float | None,
    seed: int,
    shape: Path | None = None,
    variant: dict[str, object] | None = None,
) -> dict[str, float]:
    """One canary run through the real CLI (``interval`` None: no sampling; ``shape``: replay
    it with ``--workload`` instead of the fixed lengths; ``variant``: body fields changed, see
    bench/_canary_body_variant.py)."""
    extra = ["--metrics-url", "none"] if interval is None else ["--sample-interval", str(interval)]
    lengths = (
        ["--workload", str(shape)] if shape is not None
        else ["--prompt-length", str(args.prompt_length),
              "--output-length", str(args.output_length)]
    )  # fmt: skip
    cli = (
        ["-m", "latency_checker"] if variant is None
        else [str(ROOT / "bench" / "_canary_body_variant.py"), json.dumps(variant), "--"]
    )  # fmt: skip
    subprocess.run(
        [sys.executable, *cli, "--endpoint", f"{base_url}/v1/completions",
         "--concurrency", str(args.concurrency), "--num-requests", str(args.requests),
         *lengths, "--warmup", "4", "--seed", str(seed), "--quiet", "--output-json", str(out),
         *extra],
        check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    r = json.loads(out.read_text())
    return {
        "ttft_p50": r["ttft_ms"]["p50"], "ttft_p99": r["ttft_ms"]["p99"],
        "tpot_p50": r["tpot_ms"]["p50"], "tpot_p99": r["tpot_ms"]["p99"],
        "tokens": r["tokens"]["streamed"], "cpu_s": r["client_cpu"]["seconds"],
        "wall_s": r["throughput"]["wall_s"],
    }  # fmt: skip


def run_peer(
    base_url: str, model_dir: Path, args: argparse.Namespace, out: Path, *, seed: int
) -> dict[str, float]:
    """One `vllm bench serve` run on the same workload."""
    host, port = base_url.removeprefix("http://").split(":")
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "_vllm_bench_serve_peer.py"), str(out), "--",
         "--backend", "vllm", "--host", host, "--port", port, "--endpoint", "/v1/completions",
         "--model", "tiny-llama", "--tokenizer", str(model_dir),
         "--dataset-name", "random", "--random-input-len", str(args.prompt_length),
         "--random-output-len", str(args.output_length), "--random-range-ratio", "0",
         "--num-prompts", str(args.requests), "--max-concurrency", str(args.concurrency),
         "--request-rate", "inf", "--ignore-eos", "--num-warmups", "4", "--disable-tqdm",
         "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99",
         "--seed", str(seed)],
        check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    r = json.loads(out.read_text())
    return {
        "ttft_p50": r["p50_ttft_ms"], "ttft_p99": r["p99_ttft_ms"],
        "tpot_p50": r["p50_tpot_ms"], "tpot_p99": r["p99_tpot_ms"],
        "tokens": r["total_output_tokens"], "cpu_s": r["cpu_s"], "wall_s": r["wall_s"],
    }  # fmt: skip


def engine_flags(args: argparse.Namespace) -> list[str]:
    """The bench engine's flags: eager, and without the prefix cache unless asked for."""
    return ["--enforce-eager", *([] if args.prefix_caching else ["--no-enable-prefix-caching"])]


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    """Median of each number across rounds."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    """Run the comparison and print a table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=150)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--prompt-length", type=int, default=512)
    parser.add_argument("--output-length", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--intervals",
        type=lambda text: [float(x) for x in text.split(",")],
        default=[0.5, 1.0, 2.0],
        help="in-flight /metrics sampling intervals to compare (seconds, comma-separated)",
    )
    parser.add_argument(
        "--prefix-caching",
        action="store_true",
        help="keep vLLM's prefix cache on (off by default: the peer's random prompts repeat on "
        "the test model's 320-token vocabulary, and the cache served about half their tokens)",
    )
    parser.add_argument(
        "--shape",
        type=Path,
        default=None,
        help="a workload shape for the shape round [default: the fixed workload's lengths]",
    )
    args = parser.parse_args()
    shape_file = args.shape or Path(tempfile.mkdtemp(prefix="ruleloop-bench-")) / "exact.yaml"
    if args.shape is None:
        shape_file.write_text(exact_shape(args))

    manager = EngineManager(state_dir=Path(tempfile.mkdtemp(prefix="ruleloop-bench-")))
    port = free_port()
    print(f"starting vLLM on port {port} ...", flush=True)
    info = manager.start(port=port, flags=engine_flags(args), on_progress=print)
    model_dir = manager.state_dir / "tiny-llama"
    Client = Callable[[Path, int], dict[str, float]]  # (report path, seed) -> numbers

    def sampled(interval: float) -> Client:
        return lambda out, seed: run_canary(info.base_url, args, out, interval=interval, seed=seed)

    clients: dict[str, Client] = {f"canary {i:g}s": sampled(i) for i in args.intervals}
    clients["canary, no sampling"] = lambda out, seed: run_canary(
        info.base_url, args, out, interval=None, seed=seed
    )
    clients[f"canary --workload {shape_file.name}, 2s"] = lambda out, seed: run_canary(
        info.base_url, args, out, interval=2.0, seed=seed, shape=shape_file
    )
    clients[PEER] = lambda out, seed: run_peer(info.base_url, model_dir, args, out, seed=seed)
    seeds = itertools.count(1)  # every run its own prompts: none hits an earlier one's cache
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in clients}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.rounds):
                names = list(clients)
                names = names[i % len(names) :] + names[: i % len(names)]  # rotate the order
                for name in names:
                    print(f"round {i + 1}/{args.rounds}: {name} ...", flush=True)
                    out = Path(tmp) / f"{i}-{len(runs[name])}.json"
                    seed = next(seeds)
                    runs[name].append(
                        with_cache_share(info.base_url, lambda: clients[name](out, seed))  # noqa: B023
                    )
                    print("   ", {k: round(v, 2) for k, v in runs[name][-1].items()}, flush=True)
    finally:
        manager.stop(port)

    for side in (r for rs in runs.values() for r in rs):
        side["cpu_per_1000_tokens"] = side["cpu_s"] / side["tokens"] * 1000
    medians = {name: median_of(r) for name, r in runs.items()}
    peer = medians[PEER]
    rows = ["ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "cpu_per_1000_tokens", "wall_s",
            "prefix_cache_hit_share"]  # fmt: skip
    print(
        f"\n{args.concurrency} streams, {args.requests} requests, {args.prompt_length} prompt "
        f"+ {args.output_length} output tokens, median of {args.rounds} rotated rounds, "
        f"engine flags {' '.join(engine_flags(args))}, load average {os.getloadavg()[0]:.1f}"
    )
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines()
                  if line.startswith("Model name")), "unknown CPU")  # fmt: skip
    print(f"CPU: {model}")
    print("| client | " + " | ".join(rows) + " | TTFT p50 / peer | TPOT p50 / peer | CPU / peer |")
    print("|---" * (len(rows) + 4) + "|")
    for name, side in medians.items():
        cells = " | ".join(f"{side[k]:.3f}" if k.startswith(("cpu", "prefix")) else f"{side[k]:.1f}"
                           for k in rows)  # fmt: skip
        ratios = " | ".join(
            f"{side[k] / peer[k]:.3f}" for k in ("ttft_p50", "tpot_p50", "cpu_per_1000_tokens")
        )
        print(f"| {name} | {cells} | {ratios} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "canary_vs_vllm_bench.json").write_text(
        json.dumps(
            {
                "args": {**vars(args), "shape": str(shape_file)},
                "cpu": model,
                "runs": runs,
                "median": medians,
            },
            indent=2,
        )  # fmt: skip
    )


if __name__ == "__main__":
    main()
