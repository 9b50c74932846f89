"""The canary's judge, old and new, on simulated canaries drawn from measured latencies.

    python bench/judge_bench.py [--requests 600] [--trials 500] [--pool FILE]

First it measures: a real vLLM engine (CPU, tiny model; ``ruleloop engine``'s) serves chats
(128-token prompts, 8 tokens out, 4 streams) while long prompts (2,048 tokens) keep arriving
beside them, the demo's incident; every chat's TPOT and TTFT is kept (``--pool`` reuses a pool
saved by an earlier run). Then it draws ``--trials`` canaries per cell from that pool: a
before-run and an after-run of n requests each, the after-run's values multiplied by the true
effect (1.0: a change that does nothing, A/A; 0.3: a fix that more than halves latency), and
judges each under the demo's gate ``max_tpot_p99_ms: 0.5x before`` two ways:

* old: the point p99 (linear interpolation) of the after-run <= 0.5 x the before-run's: with 4
  requests, half of one maximum against another maximum;
* new (``bot.canary.stats.judge_ratio`` at 99 %): met when the after-run is significantly below
  half the before-run (one-sided Mann-Whitney U), missed when significantly above, else
  inconclusive (which fails safe: not kept).

Then the absolute gate ``max_tpot_p99_ms <= limit`` with the limit 25 % above or below the
pool's p99: the point p99 against ``judge_limit`` (the p99's order-statistic interval).

Then looks (``Gates.looks``): the same ``0.5x before`` gate judged at one look of n after-run
requests (at 99 %), against two looks (n, then 2n when the first is undecided, each at
p < 0.005), the before-run fixed at n as in /apply-adr: how often each keeps, wrongly keeps, and
how many after-run requests it sent on average.

Reported per cell: how often the change is kept, and the wrong verdicts: a false keep (kept
though the truth misses the gate) and a false rollback (a "missed" though the truth meets it);
inconclusive counts apart. Results: bench/results/judge_bench.json and a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fleet_scrape_bench import cpu  # noqa: E402
from bot.canary.runner import CanaryRun  # noqa: E402
from bot.canary.stats import judge_limit, judge_ratio  # noqa: E402
from bot.canary.workload import Workload  # noqa: E402
from bot.engine.process import EngineManager, free_port  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SIZES = (4, 16, 64, 256)
EFFECTS = (0.3, 0.45, 0.7, 1.0, 1.5)  # after = effect x before; the gate asks for <= 0.5
RATIO = 0.5
CONFIDENCE = 0.99


async def measure_pool(requests: int) -> dict[str, list[float]]:
    """Per-request TPOT and TTFT (ms) of chats beside long prompts on a real engine."""
    manager = EngineManager(state_dir=Path(tempfile.mkdtemp(prefix="judge-bench-")))
    port = free_port()
    flags = ["--enforce-eager", "--max-num-batched-tokens", "8192", "--max-num-seqs", "32"]
    print(f"starting vLLM on port {port} ({' '.join(flags)}) ...", file=sys.stderr)
    info = manager.start(port=port, flags=flags, timeout_s=600)
    try:
        url = f"{info.base_url}/v1/completions"
        chats = CanaryRun(
            Workload(endpoint=url, concurrency=4, num_requests=requests, prompt_length=128,
                     output_length=8, warmup_requests=4)
        )  # fmt: skip
        longs = CanaryRun(
            Workload(endpoint=url, concurrency=4, num_requests=None, duration_s=3600,
                     prompt_length=2048, output_length=1)
        )  # fmt: skip
        background = asyncio.create_task(longs.run())
        try:
            await chats.run()
        finally:
            background.cancel()
            await asyncio.gather(background, return_exceptions=True)
        ok = [r for r in chats.records if r.tpot_s is not None and r.ttft_s is not None]
        print(f"measured {len(ok)} chats", file=sys.stderr)
        return {
            "tpot_ms": [r.tpot_s * 1000 for r in ok if r.tpot_s is not None],
            "ttft_ms": [r.ttft_s * 1000 for r in ok if r.ttft_s is not None],
        }
    finally:
        manager.stop(port)


def point_p99(values: np.ndarray) -> float:
    return float(np.percentile(values, 99))


def ratio_cell(pool: np.ndarray, n: int, effect: float, trials: int, rng: np.random.Generator
               ) -> dict[str, Any]:  # fmt: skip
    """One cell of the ``0.5x before`` gate: old keeps, new met / missed / inconclusive."""
    truth_meets = effect < RATIO
    old_keep = met = missed = inconclusive = 0
    for _ in range(trials):
        before = rng.choice(pool, n)
        after = effect * rng.choice(pool, n)
        old_keep += point_p99(after) <= RATIO * point_p99(before)
        outcome = judge_ratio(list(before), list(after), RATIO, confidence=CONFIDENCE).outcome
        met += outcome == "met"
        missed += outcome == "missed"
        inconclusive += outcome == "inconclusive"
    return {
        "n": n, "effect": effect, "truth": "meets" if truth_meets else "misses",
        "old_keep": old_keep / trials, "new_met": met / trials, "new_missed": missed / trials,
        "new_inconclusive": inconclusive / trials,
        "old_false": (trials - old_keep if truth_meets else old_keep) / trials,
        "new_false": (missed if truth_meets else met) / trials,
    }  # fmt: skip


def limit_cell(pool: np.ndarray, n: int, slack: float, trials: int, rng: np.random.Generator
               ) -> dict[str, Any]:  # fmt: skip
    """One cell of ``max_tpot_p99_ms <= limit`` with the limit ``slack`` x the pool's p99."""
    limit = slack * point_p99(pool)
    truth_meets = slack > 1
    old_pass = met = missed = 0
    for _ in range(trials):
        run = rng.choice(pool, n)
        old_pass += point_p99(run) <= limit
        outcome = judge_limit(list(run), 0.99, limit, confidence=CONFIDENCE).outcome
        met += outcome == "met"
        missed += outcome == "missed"
    return {
        "n": n, "limit_over_true_p99": slack, "truth": "meets" if truth_meets else "misses",
        "old_pass": old_pass / trials, "new_met": met / trials, "new_missed": missed / trials,
        "new_inconclusive": (trials - met - missed) / trials,
        "old_false": (trials - old_pass if truth_meets else old_pass) / trials,
        "new_false": (missed if truth_meets else met) / trials,
    }  # fmt: skip


def looks_cell(pool: np.ndarray, n: int, effect: float, trials: int, rng: np.random.Generator
               ) -> dict[str, Any]:  # fmt: skip
    """One cell of ``0.5x before`` at one look of n against two looks (n, then 2n)."""
    truth_meets = effect < RATIO
    one = two = sent = 0
    two_conf = 1 - (1 - CONFIDENCE) / 2
    for _ in range(trials):
        before = list(rng.choice(pool, n))
        after = list(effect * rng.choice(pool, 2 * n))
        one += judge_ratio(before, after[:n], RATIO, confidence=CONFIDENCE).outcome == "met"
        first = judge_ratio(before, after[:n], RATIO, confidence=two_conf).outcome
        if first == "inconclusive":
            sent += 2 * n
            two += judge_ratio(before, after, RATIO, confidence=two_conf).outcome == "met"
        else:
            sent += n
            two += first == "met"
    return {
        "n": n, "effect": effect, "truth": "meets" if truth_meets else "misses",
        "one_look_kept": one / trials, "two_looks_kept": two / trials,
        "two_looks_mean_requests": sent / trials,
        "one_look_false": ((trials - one) if truth_meets else one) / trials,
        "two_looks_false": ((trials - two) if truth_meets else two) / trials,
    }  # fmt: skip


def markdown(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """A markdown table of ``rows``: one column per (header, key, format spec)."""
    head = "| " + " | ".join(h for h, _, _ in columns) + " |"
    rule = "|" + "---|" * len(columns)
    lines = ["| " + " | ".join(format(r[k], f) for _, k, f in columns) + " |" for r in rows]
    return "\n".join([head, rule, *lines])


def table(rows: list[dict[str, Any]], effect_key: str, old_key: str) -> str:
    return markdown(rows, [
        ("n", "n", ""), (effect_key, effect_key, "g"), ("truth", "truth", ""),
        ("old: kept", old_key, ".0%"), ("old: wrong", "old_false", ".0%"),
        ("new: met", "new_met", ".0%"), ("new: missed", "new_missed", ".0%"),
        ("new: inconclusive", "new_inconclusive", ".0%"), ("new: wrong", "new_false", ".0%"),
    ])  # fmt: skip


def looks_table(rows: list[dict[str, Any]]) -> str:
    return markdown(rows, [
        ("n", "n", ""), ("effect", "effect", "g"), ("truth", "truth", ""),
        ("1 look: kept", "one_look_kept", ".0%"), ("1 look: wrong", "one_look_false", ".1%"),
        ("2 looks: kept", "two_looks_kept", ".0%"), ("2 looks: wrong", "two_looks_false", ".1%"),
        ("2 looks: requests sent", "two_looks_mean_requests", ".1f"),
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=600, help="chats measured for the pool")
    parser.add_argument("--trials", type=int, default=500, help="simulated canaries per cell")
    parser.add_argument("--pool", type=Path, help="a pool saved by an earlier run (JSON)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.pool:
        pool = json.loads(args.pool.read_text())["pool"]
    else:
        pool = asyncio.run(measure_pool(args.requests))
    tpot = np.asarray(pool["tpot_ms"], dtype=float)
    rng = np.random.default_rng(args.seed)
    shown = f"TPOT p50 {np.median(tpot):.1f} ms, p99 {point_p99(tpot):.1f} ms"
    print(f"pool: {tpot.size} chats, {shown}; {args.trials} canaries per cell", file=sys.stderr)
    ratio = [ratio_cell(tpot, n, e, args.trials, rng) for n in SIZES for e in EFFECTS]
    limit = [limit_cell(tpot, n, s, args.trials, rng) for n in (16, 64, 256, 1024)
             for s in (0.75, 1.25)]  # fmt: skip
    looks = [looks_cell(tpot, n, e, args.trials, rng) for n in (8, 16, 32)
             for e in (0.3, 0.4, 0.5, 1.0)]  # fmt: skip
    machine = cpu()
    out = {
        "date": dt.date.today().isoformat(), "cpu": machine, "trials": args.trials,
        "confidence": CONFIDENCE, "pool": pool, "ratio_gate": ratio, "limit_gate": limit,
        "looks": looks,
    }  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "judge_bench.json").write_text(json.dumps(out, indent=1))
    print(f"CPU: {machine['model_name']}, AVX-512 {'yes' if machine['avx512'] else 'no'}")
    print(f"\n`max_tpot_p99_ms: {RATIO}x before` (after = effect x before):\n")
    print(table(ratio, "effect", "old_keep"))
    print("\n`max_tpot_p99_ms <= limit` (limit = x the true p99):\n")
    print(table(limit, "limit_over_true_p99", "old_pass"))
    print(f"\n`max_tpot_p99_ms: {RATIO}x before`, one look against two (n, then 2n):\n")
    print(looks_table(looks))


if __name__ == "__main__":
    main()
