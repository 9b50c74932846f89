"""`ruleloop runbooks validate [PATH...]`: check runbook files as the bot does when it starts.

Every problem is printed as ``file:line: field: why`` (what to write instead), as `ruleloop adr
validate` prints its own; the command exits non-zero when there is one, so CI refuses a runbook
with an unknown reading, a condition that does not parse or a cause no vocabulary knows long
before it would be read at 2 a.m.
"""

from __future__ import annotations

from pathlib import Path

import click

from bot.kernel import UsageError


@click.group()
def runbooks() -> None:
    """The runbooks: which probes run for an alert, their findings and hypotheses."""


@runbooks.command("validate")
@click.argument("paths", nargs=-1, type=click.Path(exists=True, path_type=Path))
def validate_cmd(paths: tuple[Path, ...]) -> None:
    """Check runbook files (a directory: its *.yaml; default: runbooks/): schema, probes and
    their params, readings, conditions, and the causes the hypotheses name."""
    from bot.diagnosis.runbooks import default_registry, inspect_file

    files = _collect(paths or (Path("runbooks"),))
    registry = default_registry()
    problems = [p for path in files for p in inspect_file(path, registry)[1]]
    for problem in problems:
        click.echo(problem, err=True)
    if problems:
        raise UsageError(f"{len(problems)} problem(s) found; fix them and run again")
    click.echo(f"ok: {len(files)} runbook file(s) are valid")


def _collect(paths: tuple[Path, ...]) -> list[Path]:
    """The YAML files named, and those directly in the directories named."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted([*path.glob("*.yaml"), *path.glob("*.yml")])
            if not found:
                raise UsageError(f"no runbooks (*.yaml) in {path}")
            files += found
        else:
            files.append(path)
    return files


def register(cli: click.Group) -> None:
    """Add `runbooks` to the ruleloop command line."""
    cli.add_command(runbooks)
