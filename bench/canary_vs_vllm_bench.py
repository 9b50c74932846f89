"""Canary vs vLLM's own `vllm bench serve`: same workload, same engine, one run.

    python bench/canary_vs_vllm_bench.py [--concurrency 150] [--requests 300] [--rounds 5]
                                         [--intervals 0.5,1,2]

Starts a local engine, then runs the clients in a rotating order (A B C, B C A, ...) so that
drift on this noisy 2-core box hits each alike: the canary at each in-flight /metrics sampling
interval (every sample makes vLLM's API server render its page: the observer effect), the
canary without sampling, and the peer. Reports the median over rounds of TTFT p50/p99, TPOT
p50/p99 and client CPU seconds per 1,000 streamed tokens (load phase only), and each client's
ratio to the peer. Results land in bench/results/canary_vs_vllm_bench.json.
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
PEER = "vllm bench serve"


def run_canary(
    base_url: str, args: argparse.Namespace, out: Path, *, interval: float | None
) -> dict[str, float]:
    """One canary run through the real CLI (``interval`` None: no sampling)."""
    extra = ["--metrics-url", "none"] if interval is None else ["--sample-interval", str(interval)]
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
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--intervals",
        type=lambda text: [float(x) for x in text.split(",")],
        default=[0.5, 1.0, 2.0],
        help="in-flight /metrics sampling intervals to compare (seconds, comma-separated)",
    )
    args = parser.parse_args()

    manager = EngineManager(state_dir=Path(tempfile.mkdtemp(prefix="ruleloop-bench-")))
    port = free_port()
    print(f"starting vLLM on port {port} ...", flush=True)
    info = manager.start(port=port, flags=["--enforce-eager"], on_progress=print)
    model_dir = manager.state_dir / "tiny-llama"
    clients = {
        f"canary {interval:g}s": (
            lambda out, i=interval: run_canary(info.base_url, args, out, interval=i)
        )
        for interval in args.intervals
    }
    clients["canary, no sampling"] = lambda out: run_canary(info.base_url, args, out, interval=None)
    clients[PEER] = lambda out: run_peer(info.base_url, model_dir, args, out)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in clients}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.rounds):
                names = list(clients)
                names = names[i % len(names) :] + names[: i % len(names)]  # rotate the order
                for name in names:
                    print(f"round {i + 1}/{args.rounds}: {name} ...", flush=True)
                    runs[name].append(clients[name](Path(tmp) / f"{i}-{len(runs[name])}.json"))
                    print("   ", {k: round(v, 2) for k, v in runs[name][-1].items()}, flush=True)
    finally:
        manager.stop(port)

    for side in (r for rs in runs.values() for r in rs):
        side["cpu_per_1000_tokens"] = side["cpu_s"] / side["tokens"] * 1000
    medians = {name: median_of(r) for name, r in runs.items()}
    peer = medians[PEER]
    rows = ["ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "cpu_per_1000_tokens", "wall_s"]
    print(
        f"\n{args.concurrency} streams, {args.requests} requests, {args.prompt_length} prompt "
        f"+ {args.output_length} output tokens, median of {args.rounds} rotated rounds"
    )
    print("| client | " + " | ".join(rows) + " | TTFT p50 / peer | TPOT p50 / peer | CPU / peer |")
    print("|---" * (len(rows) + 4) + "|")
    for name, side in medians.items():
        cells = " | ".join(f"{side[k]:.3f}" if k.startswith("cpu") else f"{side[k]:.1f}"
                           for k in rows)  # fmt: skip
        ratios = " | ".join(
            f"{side[k] / peer[k]:.3f}" for k in ("ttft_p50", "tpot_p50", "cpu_per_1000_tokens")
        )
        print(f"| {name} | {cells} | {ratios} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "canary_vs_vllm_bench.json").write_text(
        json.dumps({"args": vars(args), "runs": runs, "median": medians}, indent=2)
    )


if __name__ == "__main__":
    main()
