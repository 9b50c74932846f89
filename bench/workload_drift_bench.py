"""The workload-drift job at fleet size: 100 targets on one replica, an hour of periods.

    python bench/workload_drift_bench.py [--targets 100] [--periods 12] [--every 300] [--window 60]

A real bot (create_bot, its scheduler's own JobRunner and leases, SQLite) with ``--targets``
targets, each an engine scripted at the wire (an httpx transport that serves each host's
/metrics, growing by the requests its traffic finished, as vLLM's cumulative counters do), and
an accepted ADR in force on each that records a chat workload. Every ``--every`` seconds of a
controlled clock, each target's job captures its live shape over ``--window`` seconds (a scrape
every 5 s) and compares it with the ADR's. One target in ten switches to a long-system-prompt
workload for a third of the hour: its job re-validates the ADR's gates (a scripted canary: the
bench measures the scheduler, not a load test) and posts one thread, which closes when the
traffic returns.

Reported: CPU seconds the hour of periods cost (and so the cores it needs in real time), the
process's memory after each period (flat is the goal), and missed periods (a target's period
that did not end done). Goal: <= 1 core, memory flat, 0 missed periods. Results:
bench/results/workload_drift_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from tests import store_reads  # noqa: E402
from tests.fakes.bot import harness  # noqa: E402
from tests.test_scheduler_workload_drift import ADR, ShapeCanary, record_workload  # noqa: E402
from tests.workload_pages import LABELS, VLLM_EDGES, chat  # noqa: E402

RESULTS = ROOT / "bench" / "results"
PER_SCRAPE = 20  # requests finished per 5 s scrape interval: 4 req/s, like the ADR's chat shape


class Engine:
    """One scripted engine's counters since start, as vLLM keeps them (cumulative buckets)."""

    def __init__(self) -> None:
        self.kind = "chat"
        self.prompts = [0] * (len(VLLM_EDGES) + 1)  # per bucket, the last one +Inf
        self.outputs = [0] * (len(VLLM_EDGES) + 1)
        self.prompt_sum = self.output_sum = self.count = 0

    def finish(self, prompt: int, output: int) -> None:
        self.prompts[bisect.bisect_left(VLLM_EDGES, prompt)] += 1
        self.outputs[bisect.bisect_left(VLLM_EDGES, output)] += 1
        self.prompt_sum += prompt
        self.output_sum += output
        self.count += 1

    def page(self) -> str:
        lines = [
            f"vllm:num_requests_running{{{LABELS}}} 3.0",
            f"vllm:prompt_tokens_total{{{LABELS}}} {float(self.prompt_sum)}",
            f"vllm:generation_tokens_total{{{LABELS}}} {float(self.output_sum)}",
            f"vllm:prefix_cache_queries_total{{{LABELS}}} {float(self.prompt_sum)}",
            f"vllm:prefix_cache_hits_total{{{LABELS}}} {0.3 * self.prompt_sum}",
            f'vllm:request_success_total{{engine="0",finished_reason="length",'
            f'model_name="tiny-llama"}} {float(self.count)}',
        ]
        for name, buckets, total in (
            ("vllm:request_prompt_tokens", self.prompts, self.prompt_sum),
            ("vllm:request_generation_tokens", self.outputs, self.output_sum),
        ):
            lines.append(f"# TYPE {name} histogram")
            running = 0
            for edge, n in zip((*map(float, VLLM_EDGES), "+Inf"), buckets, strict=True):
                running += n
                lines.append(f'{name}_bucket{{engine="0",le="{edge}",model_name="tiny-llama"}} '
                             f"{float(running)}")  # fmt: skip
            lines.append(f"{name}_count{{{LABELS}}} {float(self.count)}")
            lines.append(f"{name}_sum{{{LABELS}}} {float(total)}")
        lines.append(f'http_requests_total{{handler="/v1/completions",method="POST",'
                     f'status="2xx"}} {float(self.count)}')  # fmt: skip
        return "\n".join(lines) + "\n"


class Fleet:
    """Every target's engine, scripted at the wire: each scrape of a host's /metrics first
    finishes PER_SCRAPE requests of its traffic now. Its own CPU is measured, so the bench
    reports the bot's CPU without it."""

    def __init__(self, hosts: list[str]) -> None:
        self.engines = {host: Engine() for host in hosts}
        self.cpu_s = 0.0
        self._rng = random.Random(11)

    def transport(self) -> httpx.MockTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            started = time.process_time()
            engine = self.engines[request.url.host]
            low, high = (2100, 3900) if engine.kind == "agents" else (64, 192)
            for _ in range(PER_SCRAPE):
                engine.finish(self._rng.randint(low, high), self._rng.randint(50, 400))
            response = httpx.Response(200, text=engine.page())
            self.cpu_s += time.process_time() - started
            return response

        return httpx.MockTransport(handler)


def rss_mib() -> float:
    """The process's resident memory now (not its peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                flags = Path("/proc/cpuinfo").read_text()
                return line.split(":", 1)[1].strip() + (
                    " (AVX-512)" if "avx512f" in flags else " (no AVX-512)"
                )
    except OSError:
        pass
    return platform.processor() or "unknown"


async def run(targets: int, periods: int, every: float, window: float) -> dict[str, Any]:
    hosts = [f"10.0.{i // 250}.{i % 250 + 1}" for i in range(targets)]
    names = [f"prod-{i:03d}" for i in range(targets)]
    fleet = Fleet(hosts)
    urls = list(zip(names, hosts, strict=True))
    canary = ShapeCanary()
    with tempfile.TemporaryDirectory() as tmp:
        h = harness(
            Path(tmp),
            slack=None,
            transport=fleet.transport(),
            bot_options={"gate": canary},
            targets={n: {"vllm_url": f"http://{host}:8000"} for n, host in urls},
            scheduler={"workload_every_s": every, "workload_window_s": window,
                       "targets": {n: {"adrs": [ADR]} for n in names}},
        )  # fmt: skip
        record_workload(Path(h.bot.flows.settings.paths.adr), chat())
        assert h.bot.scheduler is not None
        jobs = [j for j in h.bot.scheduler.jobs if j.name.startswith("workload:")]
        assert len(jobs) == targets, [j.name for j in h.bot.scheduler.jobs]
        drifting = hosts[::10]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        rows, missed, skipped = await run_periods(
            h, jobs, fleet, drifting, periods=periods, every=every
        )
        cpu = time.process_time() - cpu0 - fleet.cpu_s  # the bot's, without the fake engines'
        wall = time.perf_counter() - wall0
        await h.close()
    hour_s = periods * every
    return {
        "cpu": cpu_model(),
        "targets": targets,
        "periods": periods,
        "every_s": every,
        "window_s": window,
        "scrapes_per_capture": int(window // min(5.0, window / 2)) + 1,
        "cpu_s": round(cpu, 2),
        "fake_engines_cpu_s": round(fleet.cpu_s, 2),
        "wall_s": round(wall, 2),
        "cores_needed": round(cpu / hour_s, 4),
        "rss_mib_first": rows[0]["rss_mib"],
        "rss_mib_last": rows[-1]["rss_mib"],
        "rss_mib_max": max(r["rss_mib"] for r in rows),
        "missed_periods": missed,
        "skipped_periods": skipped,
        "revalidations": len(canary.shapes),
        "periods_detail": rows,
    }


async def run_periods(
    h: Any, jobs: list[Any], fleet: Fleet, drifting: list[str], *, periods: int, every: float
) -> tuple[list[dict[str, Any]], int, int]:
    """Run every job once a period on the bot's controlled clock, the ``drifting`` hosts on the
    other workload for the middle third; each period's row (the bot's CPU without the fake
    engines', its memory), and the periods missed and skipped."""
    rows, missed, skipped = [], 0, 0
    for period in range(periods):
        in_drift = periods // 3 <= period < 2 * periods // 3
        for host in drifting:
            fleet.engines[host].kind = "agents" if in_drift else "chat"
        c, w, fake = time.process_time(), time.perf_counter(), fleet.cpu_s
        results = []
        for job in jobs:
            ran = await h.bot.scheduler.runner.tick(job)
            results.extend(ran)
            missed += not any(r.state == "done" for r in ran)
            skipped += sum(1 for r in ran if "skipped" in r.detail)
        await h.bot.tasks.drain()
        with h.bot.db.transaction() as s:
            open_threads = sum(1 for i in store_reads.incidents(s) if i.open_key)
        rows.append({
            "period": period,
            "cpu_s": round(time.process_time() - c - (fleet.cpu_s - fake), 3),
            "wall_s": round(time.perf_counter() - w, 3),
            "rss_mib": round(rss_mib(), 1),
            "drifted": sum(1 for r in results if r.detail.get("drifted")),
            "open_threads": open_threads,
        })  # fmt: skip
        print(
            f"period {period + 1:2d}/{periods}: {rows[-1]['cpu_s']:6.2f} s CPU, "
            f"{rows[-1]['wall_s']:6.2f} s wall, {rows[-1]['rss_mib']:6.1f} MiB, "
            f"{rows[-1]['drifted']} drifted, {open_threads} threads open",
            flush=True,
        )
        h.wall.advance(every)
    return rows, missed, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=100)
    parser.add_argument("--periods", type=int, default=12, help="periods to run (12 x 300 s = 1 h)")
    parser.add_argument("--every", type=float, default=300.0, help="seconds between captures")
    parser.add_argument("--window", type=float, default=60.0, help="seconds each capture covers")
    args = parser.parse_args()
    result = asyncio.run(run(args.targets, args.periods, args.every, args.window))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "workload_drift_bench.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"\n{result['cpu']}\n{result['targets']} targets x {result['periods']} periods of "
        f"{result['every_s']:g} s: {result['cpu_s']:.1f} s CPU for "
        f"{result['periods'] * result['every_s'] / 3600:g} h of periods = "
        f"{result['cores_needed']:.3f} cores (goal <= 1); memory {result['rss_mib_first']:.0f} -> "
        f"{result['rss_mib_last']:.0f} MiB (max {result['rss_mib_max']:.0f}); "
        f"missed periods {result['missed_periods']} (goal 0), "
        f"skipped {result['skipped_periods']}; "
        f"{result['revalidations']} re-validations\n-> {out.relative_to(ROOT)}"
    )


if __name__ == "__main__":
    main()
