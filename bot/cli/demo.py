"""`ruleloop demo`: the main job on embedded defaults, no Slack workspace and no GPU needed.

Replays the article's incident in miniature on the local CPU engine (see bot/demo/scenario.py):
a badly configured engine under mixed load, an alert, the diagnosis, the matching ADR applied
behind its canary gates, and the post-incident ADR drafted. The transcript (what the bot would
post in Slack) goes to stdout; progress to stderr.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from bot.cli.engine import state_dir_option
from bot.demo.scenario import BAD_FLAGS, Demo, workspace
from bot.engine.process import EngineManager, default_state_dir, free_port


@click.command("demo")
@click.option("--keep", is_flag=True, help="Leave the engine running afterwards.")
@click.option(
    "--adr-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("adr"),
    show_default=True,
    help="ADRs to start from (copied; the demo never changes them).",
)
@state_dir_option
def demo(keep: bool, adr_dir: Path, state_dir: Path | None) -> None:
    """Replay a latency incident on a local vLLM engine: alert, diagnosis, ADR fix, draft.

    \b
    1. a workspace with copies of the ADRs (plus one for the CPU engine) and a runbook
    2. vLLM on the CPU with a bad flag (--max-num-batched-tokens 8192)
    3. chats, impatient clients and long shared system prompts load it
    4. an Alertmanager alert goes to the bot's webhook; the bot diagnoses
    5. the matching ADR is requested and approved by a second person
    6. the engine restarts with the fix; a canary checks the ADR's gates (rollback if not met)
    7. the post-incident ADR is drafted; it is printed at the end
    Takes a few minutes; nothing outside the workspace is changed.
    """
    say = lambda text: click.echo(text, err=True)  # noqa: E731
    root = state_dir or default_state_dir()
    ws = workspace(root, adr_dir)
    say(f"1/7 workspace {ws}")
    manager = EngineManager(state_dir=root)
    port = free_port()
    say(f"2/7 starting vLLM (CPU, tiny model) on port {port} with {' '.join(BAD_FLAGS)} ...")
    info = manager.start(port=port, flags=BAD_FLAGS, on_progress=lambda s: say(f"    {s}"))
    try:
        scenario = Demo(
            ws=ws, base_url=info.base_url, manager=manager, say=say, transcript=sys.stdout
        )
        draft = asyncio.run(scenario.run())
    finally:
        if not keep:
            manager.stop(port)
    if draft is not None:
        click.echo(f"\n----- {draft} -----\n")
        click.echo(draft.read_text(encoding="utf-8"))
    say(f"\ntranscript above; the workspace (store, ADRs, drafts) is {ws}")
    if keep:
        say(f"engine left running at {info.base_url}; stop: ruleloop engine down --port {port}")


def register(cli: click.Group) -> None:
    """Add `demo` to the ruleloop command line."""
    cli.add_command(demo)
