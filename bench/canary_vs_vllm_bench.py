"""Canary vs vLLM's own `vllm bench serve`: same workload, same engine, one run.

    python bench/canary_vs_vllm_bench.py [--concurrency 150] [--requests 300] [--rounds 2]

Starts a local engine, then runs the clients in a rotating order (A B C, B C A, ...) so that
drift on this noisy 2-core box hits each alike: the canary, the canary without in-flight
/metrics sampling (to show what sampling costs the engine), and the peer. Reports TTFT p50/p99
and TPOT p50/p99 from each, their ratios, and client CPU seconds per 1,000 streamed tokens
(load phase only). Results land in bench/results/canary_vs_vllm_bench.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bot.engine.process import EngineManager, free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def run_canary(
    base_url: str, args: argparse.Namespace, out: Path, *, sampling: bool = True
) -> dict[str, float]:
    """One canary run through the real CLI; returns the comparable numbers."""
    extra = [] if sampling else ["--metrics-url", "none"]
    subprocess.run(
        [sys.executable, "-m", "latency_checker", "--endpoint", f"{base_url}/v1/completions",
         "--concurrency", str(args.concurrency), "--num-requests", str(args.requests),
         "--prompt-length", str(args.prompt_length), "--output-length", str(args.output_length),
         "--warmup", "4", "--quiet", "--output-json", str(out), *extra],
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
    base_url: str, model_dir: Path, args: argparse.Namespace, out: Path
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
         "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99"],
        check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    r = json.loads(out.read_text())
    return {
        "ttft_p50": r["p50_ttft_ms"], "ttft_p99": r["p99_ttft_ms"],
        "tpot_p50": r["p50_tpot_ms"], "tpot_p99": r["p99_tpot_ms"],
        "tokens": r["total_output_tokens"], "cpu_s": r["cpu_s"], "wall_s": r["wall_s"],
    }  # fmt: skip


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
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    manager = EngineManager(state_dir=Path(tempfile.mkdtemp(prefix="ruleloop-bench-")))
    port = free_port()
    print(f"starting vLLM on port {port} ...", flush=True)
    info = manager.start(port=port, flags=["--enforce-eager"], on_progress=print)
    model_dir = manager.state_dir / "tiny-llama"
    clients = {
        "canary": lambda out: run_canary(info.base_url, args, out),
        "canary, no sampling": lambda out: run_canary(info.base_url, args, out, sampling=False),
        "vllm bench serve": lambda out: run_peer(info.base_url, model_dir, args, out),
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in clients}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.rounds):
                names = list(clients)
                names = names[i % len(names) :] + names[: i % len(names)]  # rotate the order
                for name in names:
                    print(f"round {i + 1}/{args.rounds}: {name} ...", flush=True)
                    runs[name].append(clients[name](Path(tmp) / f"{i}-{name[:6]}.json"))
                    print("   ", {k: round(v, 2) for k, v in runs[name][-1].items()}, flush=True)
    finally:
        manager.stop(port)

    medians = {name: median_of(r) for name, r in runs.items()}
    for side in medians.values():
        side["cpu_per_1000_tokens"] = side["cpu_s"] / side["tokens"] * 1000
    ours, bare = medians["canary"], medians["canary, no sampling"]
    peer = medians["vllm bench serve"]
    rows = ["ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "cpu_per_1000_tokens", "wall_s"]
    print(f"\n{args.concurrency} streams, {args.requests} requests, {args.prompt_length} prompt + "
          f"{args.output_length} output tokens, median of {args.rounds} rounds")  # fmt: skip
    header = ("metric", "canary", "no-sample", "vllm bench", "ratio", "ratio*")
    print("{:<22}{:>10}{:>11}{:>12}{:>7}{:>8}".format(*header))
    for key in rows:
        print(
            f"{key:<22}{ours[key]:>10.2f}{bare[key]:>11.2f}{peer[key]:>12.2f}"
            f"{ours[key] / peer[key]:>7.3f}{bare[key] / peer[key]:>8.3f}"
        )
    print("ratio = canary / vllm bench serve; ratio* = canary without /metrics sampling / peer")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "canary_vs_vllm_bench.json").write_text(
        json.dumps({"args": vars(args), "runs": runs, "median": medians}, indent=2)
    )


if __name__ == "__main__":
    main()
