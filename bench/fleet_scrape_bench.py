"""The workload-drift job over fleets: 100 targets of 8 replicas each on one bot replica.

    python bench/fleet_scrape_bench.py [--targets 100] [--replicas 8] [--periods 12]
                                       [--every 300] [--window 60]

bench/workload_drift_bench.py's rig (a real bot from create_bot, its scheduler's JobRunner and
leases, SQLite; every engine scripted at the wire, its /metrics growing by the requests its
traffic finished) with each target a fleet: ``--replicas`` engines listed in its config, each
its own process (``process_start_time_seconds``). Every ``--every`` seconds of a controlled
clock each target's job reads every replica's /metrics in rounds 5 s apart over ``--window``
seconds (bot/diagnosis/probes/fleet_window.py: 8 scrapes at a time), merges them per engine
process and compares the fleet's shape, per replica, with its ADR's (measured on one pod). Each
replica serves the ADR's 4 req/s, so a fleet is alike; one target in ten switches every replica to a
long-system-prompt workload for the middle third of the periods and drifts (the canary is scripted,
as in the other bench).

Reported: the bot's CPU seconds over the periods (without the scripted engines'), so the cores
it needs in real time; its memory after each period (flat is the goal); missed periods (a
target's period that did not end done); and the CPU (lscpu's model name, AVX-512 or not).
Goal: <= 1 core, memory flat, 0 missed. Results: bench/results/fleet_scrape_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.workload_drift_bench import Engine, Fleet, run_periods  # noqa: E402
from tests.fakes.bot import harness  # noqa: E402
from tests.test_scheduler_workload_drift import ADR, ShapeCanary, record_workload  # noqa: E402
from tests.workload_pages import chat  # noqa: E402

RESULTS = ROOT / "bench" / "results"


class ProcessEngine(Engine):
    """A scripted engine whose page names its process, as vLLM's does (engine_identity)."""

    def __init__(self, started: float) -> None:
        super().__init__()
        self.started = started

    def page(self) -> str:
        return super().page() + f"process_start_time_seconds {self.started!r}\n"


def cpu() -> dict[str, Any]:
    """lscpu's model name and whether the CPU has AVX-512 (its flags)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {"model_name": "unknown", "avx512": None}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    avx512 = sorted(f for f in flags if f.startswith("avx512"))
    return {"model_name": fields.get("Model name", "unknown").strip(), "avx512": bool(avx512),
            "avx512_flags": avx512, "cpus": fields.get("CPU(s)", "?").strip()}  # fmt: skip


async def run(
    targets: int, replicas: int, periods: int, every: float, window: float
) -> dict[str, Any]:
    names = [f"prod-{i:03d}" for i in range(targets)]
    fleets = {n: [f"10.{1 + t // 250}.{t % 250}.{r + 1}" for r in range(replicas)]
              for t, n in enumerate(names)}  # fmt: skip
    hosts = [h for fleet in fleets.values() for h in fleet]
    engines = Fleet(hosts)
    engines.engines = {h: ProcessEngine(1.79e9 + n) for n, h in enumerate(hosts)}
    canary = ShapeCanary()
    with tempfile.TemporaryDirectory() as tmp:
        h = harness(
            Path(tmp),
            slack=None,
            transport=engines.transport(),
            bot_options={"gate": canary},
            targets={n: {"vllm_url": f"http://{fleet[0]}:8000",
                         "replicas": [f"http://{host}:8000" for host in fleet]}
                     for n, fleet in fleets.items()},
            scheduler={"workload_every_s": every, "workload_window_s": window,
                       "targets": {n: {"adrs": [ADR]} for n in names}},
        )  # fmt: skip
        record_workload(Path(h.bot.flows.settings.paths.adr), chat())  # one pod's, per replica
        assert h.bot.scheduler is not None
        jobs = [j for j in h.bot.scheduler.jobs if j.name.startswith("workload:")]
        assert len(jobs) == targets, [j.name for j in h.bot.scheduler.jobs]
        drifting = [fleets[n] for n in names[::10]]
        cpu0, wall0, fake0 = time.process_time(), time.perf_counter(), engines.cpu_s
        rows, missed, skipped = await run_periods(
            h, jobs, engines, [host for fleet in drifting for host in fleet],
            periods=periods, every=every,
        )  # fmt: skip
        bot_cpu = time.process_time() - cpu0 - (engines.cpu_s - fake0)
        wall = time.perf_counter() - wall0
        await h.close()
    span_s = periods * every
    return {
        "cpu": cpu(),
        "targets": targets,
        "replicas_per_target": replicas,
        "periods": periods,
        "every_s": every,
        "window_s": window,
        "scrapes_per_capture": replicas * (int(window // min(5.0, window / 2)) + 1),
        "cpu_s": round(bot_cpu, 2),
        "fake_engines_cpu_s": round(engines.cpu_s - fake0, 2),
        "wall_s": round(wall, 2),
        "cores_needed": round(bot_cpu / span_s, 4),
        "rss_mib_first": rows[0]["rss_mib"],
        "rss_mib_last": rows[-1]["rss_mib"],
        "rss_mib_max": max(r["rss_mib"] for r in rows),
        "missed_periods": missed,
        "skipped_periods": skipped,
        "revalidations": len(canary.shapes),
        "replayed_per_replica": all(
            s is None or s.arrivals.per == "replica" for s in canary.shapes
        ),
        "periods_detail": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=100)
    parser.add_argument("--replicas", type=int, default=8, help="replicas of each target")
    parser.add_argument("--periods", type=int, default=12, help="periods to run (12 x 300 s = 1 h)")
    parser.add_argument("--every", type=float, default=300.0, help="seconds between captures")
    parser.add_argument("--window", type=float, default=60.0, help="seconds each capture covers")
    parser.add_argument("--out", type=Path, default=RESULTS / "fleet_scrape_bench.json")
    args = parser.parse_args()
    result = asyncio.run(run(args.targets, args.replicas, args.periods, args.every, args.window))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    info = result["cpu"]
    print(
        f"\n{info['model_name']} ({'AVX-512' if info['avx512'] else 'no AVX-512'})\n"
        f"{result['targets']} targets x {result['replicas_per_target']} replicas x "
        f"{result['periods']} periods of {result['every_s']:g} s: {result['cpu_s']:.1f} s CPU "
        f"for {result['periods'] * result['every_s'] / 3600:g} h of periods = "
        f"{result['cores_needed']:.3f} cores (goal <= 1); memory {result['rss_mib_first']:.0f} "
        f"-> {result['rss_mib_last']:.0f} MiB (max {result['rss_mib_max']:.0f}); missed periods "
        f"{result['missed_periods']} (goal 0), skipped {result['skipped_periods']}; "
        f"{result['revalidations']} re-validations\n-> {args.out}"
    )


if __name__ == "__main__":
    main()
