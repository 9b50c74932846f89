"""What in the canary's request costs the engine: A/B of body fields on one engine, one run.

    python bench/canary_request_ab.py [--arms fields|prompt] [--concurrency 150]
                                      [--requests 300] [--rounds 3]

Starts one local engine and runs, in a rotated order (A B C D, B C D A, ...), the canary CLI
with its body changed one field at a time (bench/_canary_body_variant.py) and `vllm bench
serve` on the same workload, none of them sampling /metrics. Each arm differs from the one
before it by one field, so the ratio between neighbours prices that field. Prints the median
over rounds and each arm's ratio to the peer; results land in
bench/results/canary_request_ab.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import tempfile
from functools import partial
from pathlib import Path

import psutil
from canary_vs_vllm_bench import PEER, RESULTS, engine_flags, run_canary, run_peer, with_cache_share

from bot.engine.process import EngineManager, free_port

USAGE_ONCE = {"include_usage": True}
EVERY_CHUNK = {"include_usage": True, "continuous_usage_stats": True}
# Each arm: body fields set (None removes the field) on top of what the canary builds.
ARM_SETS: dict[str, dict[str, dict[str, object]]] = {
    # What usage per chunk and greedy sampling cost, each alone and both.
    "fields": {
        "canary, usage on every chunk, temperature 0": {
            "stream_options": EVERY_CHUNK, "temperature": 0.0,
        },
        "canary, usage once, temperature 0": {"stream_options": USAGE_ONCE, "temperature": 0.0},
        "canary, usage on every chunk, server's temperature": {
            "stream_options": EVERY_CHUNK, "temperature": None,
        },
        "canary, usage once, server's temperature": {
            "stream_options": USAGE_ONCE, "temperature": None,
        },
    },
    # The body's usage field with the prefix cache on and off (--prefix-caching).
    "usage": {
        "canary, usage once": {"stream_options": USAGE_ONCE},
        "canary, usage on every chunk": {"stream_options": EVERY_CHUNK},
    },
    # What the prompt's tokens cost: the canary's ids 100-249, or only ASCII letters' ids.
    "prompt": {
        "canary, usage once, ids 100-249": {"stream_options": USAGE_ONCE},
        "canary, usage once, ids 97-122": {"stream_options": USAGE_ONCE, "prompt_ids": [97, 123]},
        "canary, usage on every chunk, ids 100-249": {"stream_options": EVERY_CHUNK},
    },
}  # fmt: skip
NUMBERS = (
    "ttft_p50", "tpot_p50", "cpu_per_1000_tokens", "api_cpu_per_1000_tokens",
    "core_cpu_per_1000_tokens", "wall_s", "prefix_cache_hit_share",
)  # fmt: skip


def server_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds vLLM's API server and its engine core (the child processes) have used so
    far: the work a client's requests cost the server, which the machine's load changes less
    than it changes wall times."""
    root = psutil.Process(pid)
    core = sum(sum(p.cpu_times()[:2]) for p in root.children(recursive=True))
    return sum(root.cpu_times()[:2]), core


def main() -> None:
    """Run every arm and the peer in rotated rounds on one engine; print the medians."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=150)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--prompt-length", type=int, default=512)
    parser.add_argument("--output-length", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--arms", choices=sorted(ARM_SETS), default="fields")
    parser.add_argument("--prefix-caching", action="store_true", help="keep vLLM's prefix cache")
    args = parser.parse_args()
    manager = EngineManager(state_dir=Path(tempfile.mkdtemp(prefix="ruleloop-ab-")))
    port = free_port()
    info = manager.start(port=port, flags=engine_flags(args), on_progress=print)
    model_dir = manager.state_dir / "tiny-llama"
    arms = ARM_SETS[args.arms]
    names = [*arms, PEER]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    seeds = itertools.count(1)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.rounds):
                for name in names[i % len(names) :] + names[: i % len(names)]:
                    out, seed = Path(tmp) / f"{i}-{len(runs[name])}.json", next(seeds)
                    server0 = server_cpu_s(info.pid)
                    arm = partial(run_arm, info.base_url, model_dir, args, arms, name, out, seed)
                    side = with_cache_share(info.base_url, arm)
                    side["cpu_per_1000_tokens"] = side["cpu_s"] / side["tokens"] * 1000
                    api, core = server_cpu_s(info.pid)  # warmup and preflight included
                    side["api_cpu_per_1000_tokens"] = (api - server0[0]) / side["tokens"] * 1000
                    side["core_cpu_per_1000_tokens"] = (core - server0[1]) / side["tokens"] * 1000
                    runs[name].append(side)
                    print(f"round {i + 1}: {name}:", {k: round(side[k], 3) for k in NUMBERS})
    finally:
        manager.stop(port)
    report(args, runs)


def run_arm(
    base_url: str,
    model_dir: Path,
    args: argparse.Namespace,
    arms: dict[str, dict[str, object]],
    name: str,
    out: Path,
    seed: int,
) -> dict[str, float]:
    """One run of an arm: the peer, or the canary with that arm's body."""
    if name == PEER:
        return run_peer(base_url, model_dir, args, out, seed=seed)
    return run_canary(base_url, args, out, interval=None, seed=seed, variant=arms[name])


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, float]]]) -> None:
    """Print the medians with ratios to the peer, and write them to the results file."""
    medians = {
        name: {k: statistics.median(r[k] for r in rs) for k in NUMBERS} for name, rs in runs.items()
    }
    peer = medians[PEER]
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines()
                  if line.startswith("Model name")), "unknown CPU")  # fmt: skip
    print(
        f"\n{args.concurrency} streams, {args.requests} requests of {args.prompt_length} + "
        f"{args.output_length} tokens, median of {args.rounds} rotated rounds, no sampling, "
        f"engine flags {' '.join(engine_flags(args))}"
    )
    print(f"CPU: {model}, load average {os.getloadavg()[0]:.1f} at the end")
    print("CPU seconds per 1,000 streamed tokens: the client's, vLLM's API server's, its engine "
          "core's\n| arm | TTFT p50 ms | TPOT p50 ms | client CPU | API server CPU | engine core "
          "CPU | wall s | TTFT / peer | TPOT / peer | client CPU / peer | API server CPU / peer "
          "| engine core CPU / peer | prefix cache hit share |\n" + "|---" * 13 + "|")  # fmt: skip
    for name, m in medians.items():
        ratios = " | ".join(f"{m[k] / peer[k]:.2f}" for k in NUMBERS[:5])
        print(f"| {name} | {m['ttft_p50']:,.1f} | {m['tpot_p50']:.1f} | "
              f"{m['cpu_per_1000_tokens']:.3f} | {m['api_cpu_per_1000_tokens']:.3f} | "
              f"{m['core_cpu_per_1000_tokens']:.3f} | {m['wall_s']:.1f} | {ratios} | "
              f"{m['prefix_cache_hit_share']:.2f} |")  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "canary_request_ab.json").write_text(
        json.dumps({"args": vars(args), "cpu": model, "runs": runs, "median": medians}, indent=2)
    )


if __name__ == "__main__":
    main()
