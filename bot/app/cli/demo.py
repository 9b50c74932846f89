"""`ruleloop demo`: the main job on embedded defaults, no Slack workspace and no GPU needed.

Replays the article's incident in miniature on the local CPU engine (see bot/app/demo/scenario.py):
the engine's normal measured, a bad flag's incident under mixed load, an alert, the diagnosis,
the matching ADR applied behind its canary gates, the post-incident ADR drafted, and then a
workload drift the scheduler's workload job re-validates the ADR against. The
transcript (what the bot would post in Slack), the draft and a last screen with the numbers go
to stdout; progress to stderr. When the loop does not close (no incident on this machine, a
failed remediation, no draft) it exits 1 and says why.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

from bot.app.cli.engine import cpu_limit_option, state_dir_option

# The first start has nothing measured to size it from: about 30 s on an AVX-512 machine, 3-7
# minutes at a tenth of one core (imports and all); past this the engine is broken.
FIRST_START_S = 900.0


@click.command("demo")
@click.option("--keep", is_flag=True, help="Leave the engine running afterwards.")
@click.option(
    "--adr-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("adr"),
    show_default=True,
    help="ADRs to start from (copied; the demo never changes them).",
)
@cpu_limit_option("--engine-cpu-limit")
@state_dir_option
def demo(keep: bool, adr_dir: Path, cpu_limit: float | None, state_dir: Path | None) -> None:
    """The whole loop on a local CPU engine: incident, diagnosis, fix, draft, drift.

    \b
    1. a workspace with copies of the ADRs (plus one for the CPU engine) and a runbook
    2. vLLM on the CPU with a bad flag (--max-num-batched-tokens 8192)
    3. chats alone: the scheduler's snapshots measure the engine's normal four numbers
    4. long prompts join the chats: with the bad flag they stall every chat token
    5. an Alertmanager alert goes to the bot's webhook; the bot diagnoses against normal
    6. the matching ADR (TPOT p99 > 3x normal) is requested and approved by a second person
    7. the engine restarts with the fix; a canary checks the ADR's gates (rollback if not met)
    8. the post-incident ADR is drafted for review
    9. the workload drifts (an agent workflow joins): the scheduler's workload job re-runs
       the ADR's gates on the live shape; the draft and the numbers are printed at the end
    Each step prints its time since the start (the fix's step split into before-run, restart
    and canary): about 2 minutes on an AVX-512 machine, 5-7 at a tenth of its core. Nothing
    outside the workspace is changed. Exits 1, saying why, when the loop does not close.
    """
    from bot.app.demo import screen  # here: `ruleloop --help` does not load the bot and matplotlib
    from bot.app.demo.scenario import BAD_FLAGS, Demo, workspace
    from bot.engine import EngineManager, default_state_dir, free_port

    started = time.monotonic()
    say = _stepper(started)
    root = state_dir or default_state_dir()
    ws = workspace(root, adr_dir)
    say(f"1/10 workspace {ws}")
    manager = EngineManager(state_dir=root, cpu_limit=cpu_limit)
    port = free_port()
    limit = "" if cpu_limit is None else f", limited to {cpu_limit:g} cores"
    flags = " ".join(BAD_FLAGS)
    say(f"2/10 starting vLLM (CPU, tiny model{limit}) on port {port} with {flags} ...")
    begun = time.monotonic()
    info = manager.start(
        port=port, flags=BAD_FLAGS, timeout_s=FIRST_START_S, on_progress=lambda s: say(f"    {s}")
    )
    start_s = time.monotonic() - begun
    say(f"    vLLM serves after {_elapsed(start_s)}")
    try:
        scenario = Demo(
            ws=ws, base_url=info.base_url, manager=manager, say=say, transcript=sys.stdout,
            start_s=start_s,
        )  # fmt: skip
        result = asyncio.run(scenario.run())
    finally:
        if not keep:
            manager.stop(port)
    say(f"the loop took {_elapsed(time.monotonic() - started)}")
    click.echo(f"\n----- {result.draft} -----\n")
    click.echo(result.draft.read_text(encoding="utf-8"))
    click.echo(screen.render(result), nl=False)
    say(f"\ntranscript above; the workspace (store, ADRs, drafts, chart) is {ws}")
    if keep:
        say(f"engine left running at {info.base_url}; stop: ruleloop engine down --port {port}")


def register(cli: click.Group) -> None:
    """Add `demo` to the ruleloop command line."""
    cli.add_command(demo)


def _stepper(started: float) -> Callable[[str], None]:
    """Progress on stderr; each step's line ("5/10 ...") shows the time since the start, so a
    slow machine shows where its minutes went."""

    def say(text: str) -> None:
        step = re.match(r"\d+/\d+ ", text) is not None
        stamp = f"[{_elapsed(time.monotonic() - started)}] " if step else ""
        click.echo(stamp + text, err=True)

    return say


def _elapsed(seconds: float) -> str:
    """'4:07' (minutes:seconds)."""
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}:{rest:02d}"
