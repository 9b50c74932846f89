"""`ruleloop config reference`: the Markdown reference of every setting, from the model itself."""

from __future__ import annotations

import click


@click.group("config")
def config() -> None:
    """The bot's settings (TOML file + environment).

    \b
    Example:
      ruleloop config reference > docs/configuration.md
    """


@config.command("reference")
def reference() -> None:
    """Print the configuration reference (every table, key, type, default, env var) as Markdown."""
    from bot.app.cli.config_reference import render

    click.echo(render(), nl=False)


def register(group: click.Group) -> None:
    """Add `config` to the CLI."""
    group.add_command(config)
