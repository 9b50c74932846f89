"""Options several commands share, declared once: the same flag reads the same everywhere."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def config_option(
    help: str = "TOML settings file (default: $RULELOOP_CONFIG).",
) -> Callable[[F], F]:
    """``--config FILE`` into ``config_path`` (None: $RULELOOP_CONFIG, then the defaults);
    ``help`` says what this command reads from it."""
    return click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help=help,
    )
