"""`ruleloop engine up|down|status`: the local vLLM engine on CPU."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from bot.engine import DEFAULT_PORT, ENV_VAR, MAX_CORES, MIN_CORES, START_TIMEOUT_S, EngineManager

F = TypeVar("F", bound=Callable[..., object])
state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="RULELOOP_STATE_DIR",
    default=None,
    help="Where engine state, logs and the tiny model live [default: ~/.local/state/ruleloop].",
)


def cpu_limit_option(name: str) -> Callable[[F], F]:
    """``name`` CORES: the engine under a CPU quota (also RULELOOP_ENGINE_CPU_LIMIT)."""
    return click.option(
        name,
        "cpu_limit",
        type=click.FloatRange(MIN_CORES, MAX_CORES),
        envvar=ENV_VAR,
        default=None,
        metavar="CORES",
        help=f"Run the engine under a CPU quota of CORES (0.1 = a tenth of one core; a cgroup, "
        f"needs root): this machine as slow as one many times slower [env: {ENV_VAR}].",
    )


@click.group("engine")
def engine() -> None:
    """Run a real vLLM engine locally (CPU, tiny dummy-weight model) for canaries and demos.

    \b
    Examples:
      ruleloop engine up --port 8000 -- --enforce-eager --max-num-batched-tokens 2048
      ruleloop engine status
      ruleloop engine down --port 8000
    """


@engine.command("up", context_settings={"ignore_unknown_options": True})
@click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=START_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for the engine to serve.",
)
@cpu_limit_option("--cpu-limit")
@state_dir_option
@click.argument("vllm_flags", nargs=-1, type=click.UNPROCESSED)
def up(
    port: int,
    host: str,
    timeout_s: float,
    cpu_limit: float | None,
    state_dir: Path | None,
    vllm_flags: tuple[str, ...],
) -> None:
    """Start the engine and wait until it serves. Flags after `--` go to vLLM unchanged."""
    manager = EngineManager(state_dir=state_dir, cpu_limit=cpu_limit)
    limit = "" if cpu_limit is None else f" (limited to {cpu_limit:g} cores)"
    click.echo(f"starting vLLM on {host}:{port}{limit} {' '.join(vllm_flags)}".rstrip(), err=True)
    info = manager.start(
        port=port,
        host=host,
        flags=list(vllm_flags),
        timeout_s=timeout_s,
        on_progress=lambda line: click.echo(line, err=True),
    )
    click.echo(f"vLLM serving at {info.base_url} (pid {info.pid}, model {info.model})")
    click.echo(f"  completions: {info.base_url}/v1/completions   metrics: {info.base_url}/metrics")
    click.echo(f"  log: {info.log_path}   stop: ruleloop engine down --port {port}")


@engine.command("down")
@click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True)
@click.option("--all", "stop_all", is_flag=True, help="Stop every engine this state dir knows.")
@state_dir_option
def down(port: int, stop_all: bool, state_dir: Path | None) -> None:
    """Stop an engine started with `ruleloop engine up`."""
    manager = EngineManager(state_dir=state_dir)
    ports = [info.port for info in manager.list()] if stop_all else [port]
    stopped = [info for p in ports if (info := manager.stop(p)) is not None]
    if not stopped:
        click.echo(f"no engine running on port {port}" if not stop_all else "no engine running")
    for info in stopped:
        click.echo(f"stopped vLLM on port {info.port} (pid {info.pid})")


@engine.command("status")
@state_dir_option
def status(state_dir: Path | None) -> None:
    """List running engines with their flags."""
    engines = EngineManager(state_dir=state_dir).list()
    if not engines:
        click.echo("no engine running; start one with `ruleloop engine up`")
        return
    for info in engines:
        flags = " ".join(info.flags) or "(vLLM defaults)"
        click.echo(f"port {info.port}  pid {info.pid}  {info.base_url}  flags: {flags}")


def register(cli: click.Group) -> None:
    """Add `engine` to the ruleloop command line."""
    cli.add_command(engine)
