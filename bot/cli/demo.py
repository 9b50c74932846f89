"""`ruleloop demo`: the main job on embedded defaults.

Starts the local engine, runs a canary against it and prints the four-metric baseline. Needs no
Slack workspace and no GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from bot.canary.render import summary_table
from bot.canary.report import Gates
from bot.canary.workload import Workload
from bot.cli.canary import run_canary
from bot.cli.engine import state_dir_option
from bot.engine.process import EngineManager, free_port


@click.command("demo")
@click.option("--concurrency", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--num-requests", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--prompt-length", type=click.IntRange(min=1), default=512, show_default=True)
@click.option("--output-length", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--output-json", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--keep", is_flag=True, help="Leave the engine running afterwards.")
@state_dir_option
def demo(
    concurrency: int,
    num_requests: int,
    prompt_length: int,
    output_length: int,
    output_json: Path | None,
    keep: bool,
    state_dir: Path | None,
) -> None:
    """Start a local vLLM engine and print its four-metric baseline from a canary run."""
    manager = EngineManager(state_dir=state_dir)
    port = free_port()
    flags = ["--enforce-eager"]
    click.echo(f"1/3 starting vLLM (CPU, tiny dummy-weight model) on port {port} ...", err=True)
    info = manager.start(
        port=port, flags=flags, on_progress=lambda s: click.echo(f"    {s}", err=True)
    )
    try:
        click.echo(
            f"2/3 canary: {num_requests} requests, {concurrency} streams, "
            f"{prompt_length} prompt + {output_length} output tokens ...",
            err=True,
        )
        workload = Workload(
            endpoint=f"{info.base_url}/v1/completions",
            concurrency=concurrency,
            num_requests=num_requests,
            prompt_length=prompt_length,
            output_length=output_length,
            warmup_requests=min(concurrency, 8),
        )
        report = run_canary(
            workload, gates=Gates(), metrics_url=f"{info.base_url}/metrics", progress=True
        )
    finally:
        if not keep:
            manager.stop(port)
    click.echo("3/3 baseline (flags: " + " ".join(flags) + ")\n")
    click.echo(summary_table(report))
    if output_json:
        output_json.write_text(json.dumps(report, indent=2))
    if keep:
        click.echo(
            f"\nengine left running at {info.base_url}; stop: ruleloop engine down --port {port}"
        )


def register(cli: click.Group) -> None:
    """Add `demo` to the ruleloop command line."""
    cli.add_command(demo)
