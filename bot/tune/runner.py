"""The experiment runner: each configuration in turn on a fresh engine, the same canary each time.

A configuration vLLM refuses becomes a row that says so, with vLLM's reason, and the run goes
on; so does one whose canary cannot run. Each row's canary JSON is written as soon as it is
measured, into the directory the draft's matrix cites.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from bot.adr import format_ms, format_pct
from bot.canary import measure_async, progress_line
from bot.engine import START_TIMEOUT_S, EngineManager, free_port
from bot.kernel import EngineError, RuleloopError
from bot.tune.matrix import TrialRow
from bot.tune.plan import Config, TunePlan

Echo = Callable[[str], None]


class TuneRunner:
    """Measures every configuration of a plan on engines started by ``manager``."""

    def __init__(
        self,
        *,
        plan: TunePlan,
        manager: EngineManager,
        runs_dir: Path,
        echo: Echo = lambda line: None,
        start_timeout_s: float = START_TIMEOUT_S,
        sample_interval_s: float = 0.5,
    ) -> None:
        self.plan = plan
        self.manager = manager
        self.runs_dir = runs_dir
        self.echo = echo
        self.start_timeout_s = start_timeout_s
        self.sample_interval_s = sample_interval_s
        self.configs = plan.configs()

    def run(self) -> list[TrialRow]:
        """Measure each configuration in turn; one row per configuration, in plan order."""
        rows = []
        for index, config in enumerate(self.configs, start=1):
            tag = f"[{index}/{len(self.configs)}] {config.name}"
            row = self.measure(config, tag)
            row.report_path = str(write_row(self.runs_dir, index, config, row))
            rows.append(row)
        return rows

    def measure(self, config: Config, tag: str) -> TrialRow:
        """One configuration on a freshly started engine, stopped again afterwards."""
        port = free_port()
        flags = " ".join(config.argv) or "(vLLM defaults)"
        self.echo(f"{tag}: starting vLLM on port {port}: {flags}")
        try:
            info = self.manager.start(
                port=port,
                flags=config.argv,
                timeout_s=self.start_timeout_s,
                on_progress=lambda line: self.echo(f"{tag}: {line}"),
            )
        except EngineError as exc:
            # vLLM exiting before it serves is its verdict on the flags; a timeout is not.
            refused = exc.refused
            self.echo(f"{tag}: {'refused' if refused else 'did not start'}: {exc}")
            return TrialRow(config, error=str(exc), failed_at="refused" if refused else "start")
        try:
            return self.measure_at(config, tag, info.base_url)
        finally:
            self.manager.stop(port)

    def measure_at(self, config: Config, tag: str, base_url: str) -> TrialRow:
        """The plan's canary against an engine already serving ``config``."""
        return asyncio.run(
            measure_canary(
                self.plan,
                config,
                base_url,
                tag=tag,
                echo=self.echo,
                sample_interval_s=self.sample_interval_s,
            )  # fmt: skip
        )


class LocalMeasurer:
    """A search's trials on fresh local engines (``TuneRunner.measure``)."""

    def __init__(self, runner: TuneRunner) -> None:
        self.runner = runner

    async def measure(self, config: Config, tag: str) -> TrialRow:
        """Start an engine with the trial's flags, run the canary, stop the engine."""
        return await asyncio.to_thread(self.runner.measure, config, tag)


async def measure_canary(
    plan: TunePlan,
    config: Config,
    base_url: str,
    *,
    tag: str,
    echo: Echo,
    sample_interval_s: float = 0.5,
) -> TrialRow:
    """The plan's canary (and background load) against an engine already serving ``config``,
    judged by the plan's gates; a canary that cannot run becomes a row that says why."""
    spec = plan.workload
    gates = plan.trial_gates()
    echo(f"{tag}: canary {spec.describe()}")
    try:
        background = [(b.name, b.workload(base_url, background=True)) for b in plan.background]
        run = await measure_async(
            spec.workload(base_url),
            gates=gates,
            metrics_url=f"{base_url}/metrics",
            background=background,
            sample_interval_s=sample_interval_s,
            on_progress=lambda p: echo(f"{tag}: {progress_line(p)}"),
            progress_interval_s=5.0,
        )
    except RuleloopError as exc:
        echo(f"{tag}: canary failed: {exc}")
        return TrialRow(config, error=str(exc), failed_at="canary")
    row = TrialRow(config, values=run.values, failures=run.failures, report=run.report)
    echo(f"{tag}: {summary(row)}")
    return row


def write_row(runs_dir: Path, index: int, config: Config, row: TrialRow) -> Path:
    """A row's canary JSON (with its flags and why it failed, if it did), as the draft cites it."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    path = runs_dir / f"{index:02d}-{config.name}.json"
    data = {
        "config": config.name,
        "engine_args": config.engine_args,
        "argv": config.argv,
        "refused": row.failed_at == "refused",
        "failed_at": row.failed_at,
        "error": row.error,
        "score": row.score,
        "report": None if row.report is None else row.report.json_dict(),
    }
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    return path


def summary(row: TrialRow) -> str:
    v = row.values
    assert v is not None
    verdict = "PASS" if not row.failures else "FAIL: " + "; ".join(row.failures)
    return (
        f"TTFT p99 {format_ms(v.ttft_p99_ms)}  TPOT p99 {format_ms(v.tpot_p99_ms)}  "
        f"goodput {format_pct(v.goodput_ratio)}  frag {format_pct(v.kv_fragmentation)}  "
        f"-> {verdict}"
    )
