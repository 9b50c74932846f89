"""`ruleloop tune`'s search against the full grid, side by side in one run, on the local engine.

    python bench/tune_vs_grid.py [--seeds 5] [--requests 384] [--out FILE.json]

The same space (3 flags, 16 flag sets), the same workload and the same objective and gates for
both. How it is done, so that nothing is simulated:

1. the grid is measured once, live: every flag set on a freshly started engine, one after
   another (GridSearch through the same session loop `ruleloop tune` runs);
2. each search seed then runs live too: Optuna's TPE asks for flag sets one at a time and only
   those are measured, fresh (a new engine each, as `ruleloop tune` does), with half the grid's
   trials as its budget. Its wall time and its numbers are its own;
3. after each seed, its pick and the grid's best are measured again back to back (not counted
   as its trials): the box's load (other work on a shared machine) moves between the grid's run
   and the seed's, and this compares the two decisions under the same load.

Reported per seed: trials, wall time (and what the grid's run spent on the same flag sets), the
flags it picked and their objective (its own measurement, the grid's measurement of the same
flags, and side by side), whether it picked the grid's best, and whether it came within 5 % of
the grid's best objective by each of the three comparisons. Goal: within 5 % of the grid's
best in at most half the trials and half the wall time. Results go to --out (JSON).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bot.engine.process import EngineManager  # noqa: E402
from bot.kernel.runtime.loop import run as run_loop  # noqa: E402
from bot.tune.matrix import TrialRow  # noqa: E402
from bot.tune.objective import TrialOutcome  # noqa: E402
from bot.tune.plan import Config, TunePlan  # noqa: E402
from bot.tune.runner import LocalMeasurer, TuneRunner  # noqa: E402
from bot.tune.search import GridSearch, Search, TpeSearch, TrialProposal  # noqa: E402
from bot.tune.session import SearchResult, run_search  # noqa: E402
from bot.tune.space import Space, flags_text  # noqa: E402

RESULTS = ROOT / "bench" / "results"
WITHIN = 0.05  # the goal: within 5 % of the grid's best objective


def plan(requests: int) -> TunePlan:
    """Three flags, 16 flag sets; chats sharing a system prompt, 8 streams; the gates."""
    return TunePlan.model_validate({
        "title": "tune vs grid",
        "baseline": {"enforce-eager": True},
        "space": {
            "max-num-seqs": {"values": [1, 2, 4, 8]},
            "max-num-batched-tokens": {"values": [128, 1024]},
            "enable-prefix-caching": {"values": [True, False]},
        },
        "objective": {"maximize": "goodput_rps"},
        "gates": {"max_ttft_p99_ms": 1000, "max_tpot_p99_ms": 100},
        "workload": {"concurrency": 8, "num_requests": requests, "prompt_length": 256,
                     "prefix_length": 192, "output_length": 32, "warmup_requests": 8},
    })  # fmt: skip


class Timed:
    """The local measurer, timing each trial (engine start, canary, stop)."""

    def __init__(self, inner: LocalMeasurer) -> None:
        self.inner = inner
        self.seconds: dict[str, float] = {}  # flag set (key) -> its trial's wall time

    async def measure(self, config: Config, tag: str) -> TrialRow:
        started = time.perf_counter()
        try:
            return await self.inner.measure(config, tag)
        finally:
            self.seconds[key(dict(config.changes))] = time.perf_counter() - started


class Fixed:
    """Given flag sets, in order (the side-by-side re-measurement of two decisions)."""

    def __init__(self, space: Space, points: list[dict[str, Any]]) -> None:
        self.space = space
        self.budget = len(points)
        self._points = list(points)

    def propose(self) -> TrialProposal | None:
        if not self._points:
            return None
        number = self.budget - len(self._points) + 1
        return TrialProposal(number=number, flags=self._points.pop(0), how="side by side")

    def report(self, proposal: TrialProposal, outcome: TrialOutcome) -> None:
        """Nothing to learn."""


def measure(
    tag: str, the_plan: TunePlan, search: Search, work: Path
) -> tuple[SearchResult, Timed, tuple[float, float]]:
    """One live search (or the grid) on fresh engines; progress lines on stderr. Also: each
    trial's time, and the 1-minute load average before and after (other work on the box)."""

    def echo(line: str) -> None:
        if "waiting for vLLM" not in line:
            print(f"[{tag}] {line}", file=sys.stderr, flush=True)

    runner = TuneRunner(plan=the_plan, manager=EngineManager(state_dir=work / "engines"),
                        runs_dir=work / tag, echo=echo, start_timeout_s=600)  # fmt: skip
    timed = Timed(LocalMeasurer(runner))
    load_before = os.getloadavg()[0]
    result = run_loop(run_search(the_plan, search, timed, runs_dir=work / tag, echo=echo))
    return result, timed, (load_before, os.getloadavg()[0])


def key(flags: dict[str, Any]) -> str:
    return json.dumps(flags, sort_keys=True)


def searched(row_flags: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {n: row_flags[n] for n in names}


def cpu() -> str:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or platform.machine()
    name = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                 if ln.startswith("Model name")), platform.machine())  # fmt: skip
    avx512 = "avx512f" in text
    return f"{name}{' (AVX-512)' if avx512 else ''}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=384)
    parser.add_argument("--out", type=Path, default=RESULTS / "tune_vs_grid.json")
    args = parser.parse_args()
    the_plan = plan(args.requests)
    space = the_plan.search_space()
    names = space.flags
    assert the_plan.objective is not None
    objective = the_plan.objective

    with tempfile.TemporaryDirectory(prefix="tune-vs-grid-") as tmp:
        work = Path(tmp)
        grid, grid_times, grid_load = measure("grid", the_plan, GridSearch(space), work)
        by_flags = {key(searched(r.config.engine_args, names)): r for r in grid.rows}
        grid_best = grid.pick
        assert grid_best is not None and grid_best.score is not None, "no grid point met the gates"
        best_value = grid_best.score
        best_key = key(searched(grid_best.config.engine_args, names))
        seeds = []
        for seed in range(args.seeds):
            search = TpeSearch(space, objective.direction, budget=space.size // 2, seed=seed)
            result, times, load = measure(f"tpe seed {seed}", the_plan, search, work)
            asked = [key(searched(r.config.engine_args, names)) for r in result.rows]
            pick = result.pick
            pick_flags = searched(pick.config.engine_args, names) if pick else None
            on_grid = by_flags.get(key(pick_flags)) if pick_flags else None
            own = pick.score if pick else None
            # the two decisions side by side, now: the search's pick and the grid's best,
            # measured back to back (not counted as trials), so the box's load, which moves
            # between the grid's run and this seed's, moves both alike
            pair = [grid_best.config.changes]
            if pick is not None and key(pick_flags) != best_key:
                pair.append(pick.config.changes)
            again = measure(f"side by side {seed}", the_plan, Fixed(space, pair), work)[0]
            now = {key(dict(r.config.changes)): r.score for r in again.rows}
            best_now = now[best_key]
            pick_now = now.get(key(pick_flags)) if pick_flags else None
            seeds.append({
                "seed": seed,
                "trials": len(result.rows),
                "wall_s": round(result.wall_s, 1),
                # what the grid's run spent on the same flag sets: the machine's load moves
                # both, so this is the like-for-like comparison of the trials' cost
                "grid_wall_s_same_points": round(sum(grid_times.seconds[k] for k in asked), 1),
                "load_avg_1m_before_after": [round(v, 2) for v in load],
                "best_flags": pick_flags,
                "best_objective": own,
                "same_flags_on_grid": on_grid.score if on_grid else None,
                "found_grid_best": pick_flags is not None and key(pick_flags) == best_key,
                "within_5pct": own is not None and own >= (1 - WITHIN) * best_value,
                "within_5pct_on_grid_numbers": on_grid is not None and on_grid.score is not None
                and on_grid.score >= (1 - WITHIN) * best_value,
                "side_by_side": {"grid_best": best_now, "search_pick": pick_now},
                "within_5pct_side_by_side": pick_now is not None and best_now is not None
                and pick_now >= (1 - WITHIN) * best_now,
                "duplicates_not_measured": search.duplicates,
                "trial_flags": [flags_text(searched(r.config.engine_args, names), names)
                                for r in result.rows],
            })  # fmt: skip

    grid_summary = {
        "trials": len(grid.rows),
        "wall_s": round(grid.wall_s, 1),
        "load_avg_1m_before_after": [round(v, 2) for v in grid_load],
        "best_flags": searched(grid_best.config.engine_args, names),
        "best_objective": best_value,
        "points": [{"flags": flags_text(searched(r.config.engine_args, names), names),
                    "objective": r.score, "meets_gates": r.passed,
                    "trial_s": round(grid_times.seconds[key(searched(r.config.engine_args,
                                                                     names))], 1)}
                   for r in grid.rows],
    }  # fmt: skip
    found = sum(1 for s in seeds if s["found_grid_best"])
    goal = {
        "seeds_within_5pct": sum(1 for s in seeds if s["within_5pct"]),
        "seeds_within_5pct_on_grid_numbers": sum(
            1 for s in seeds if s["within_5pct_on_grid_numbers"]
        ),
        "seeds_within_5pct_side_by_side": sum(1 for s in seeds if s["within_5pct_side_by_side"]),
        "seeds_at_most_half_the_trials": sum(
            1 for s in seeds if s["trials"] * 2 <= grid_summary["trials"]
        ),
        "seeds_at_most_half_the_wall_time": sum(
            1 for s in seeds if s["wall_s"] * 2 <= grid_summary["wall_s"]
        ),
        "seeds": len(seeds),
    }
    report = {
        "what": "ruleloop tune: TPE search vs the full grid, same space, workload, objective",
        "how": "grid measured once, live; each seed's search live on fresh engines, measuring "
        "only the flag sets it asks for (nothing replayed from the grid's numbers)",
        "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu": cpu(),
        "space": space.describe(),
        "objective": objective.describe(),
        "gates": the_plan.gates.model_dump(exclude_none=True) if the_plan.gates else {},
        "workload": the_plan.workload.describe(),
        "grid": grid_summary,
        "seeds": seeds,
        "found_grid_best": f"{found}/{len(seeds)}",
        "picked_within_5pct_on_grid_numbers": (
            f"{sum(1 for s in seeds if s['within_5pct_on_grid_numbers'])}/{len(seeds)}"
        ),
        "goal": goal,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"CPU: {report['cpu']}; space: {report['space']}; {report['objective']}")
    print(f"grid: {grid_summary['trials']} trials, {grid_summary['wall_s']} s, best "
          f"{flags_text(grid_summary['best_flags'], names)} = {best_value:.2f}")  # fmt: skip
    for s in seeds:
        flags = flags_text(s["best_flags"], names) if s["best_flags"] else "none"
        print(f"tpe seed {s['seed']}: {s['trials']} trials, {s['wall_s']} s (the grid spent "
              f"{s['grid_wall_s_same_points']} s on the same flag sets), best {flags} = "
              f"{s['best_objective'] or 0:.2f} (grid measured it at "
              f"{s['same_flags_on_grid'] or 0:.2f}); grid's best: "
              f"{'yes' if s['found_grid_best'] else 'no'}; within 5 %: "
              f"{'yes' if s['within_5pct'] else 'no'}; side by side, pick "
              f"{s['side_by_side']['search_pick'] or s['side_by_side']['grid_best'] or 0:.2f} vs "
              f"grid's best {s['side_by_side']['grid_best'] or 0:.2f}")  # fmt: skip
    print(
        f"found the grid's best: {found}/{len(seeds)}; within 5 % of it: "
        f"{goal['seeds_within_5pct']}/{len(seeds)} (on the grid's own numbers for the same "
        f"flags: {goal['seeds_within_5pct_on_grid_numbers']}/{len(seeds)}, side by side: "
        f"{goal['seeds_within_5pct_side_by_side']}/{len(seeds)}); at most half the "
        f"trials: {goal['seeds_at_most_half_the_trials']}/{len(seeds)}, half the wall time: "
        f"{goal['seeds_at_most_half_the_wall_time']}/{len(seeds)}; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
