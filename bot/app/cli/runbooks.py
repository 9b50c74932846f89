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
@click.option("--scenarios", "scenarios_dir", type=click.Path(path_type=Path),
              default=Path("bench/incidents"), show_default=True,
              help="The eval's scenarios (`ruleloop eval`): hypotheses none of them exercises "
              "are listed (skipped when the directory is not there).")  # fmt: skip
def validate_cmd(paths: tuple[Path, ...], scenarios_dir: Path) -> None:
    """Check runbook files (a directory: its *.yaml; default: runbooks/): schema, probes and
    their params, readings, conditions, and the causes the hypotheses name."""
    from bot.diagnosis.runbooks import default_registry, inspect_file

    files = _collect(paths or (Path("runbooks"),))
    registry = default_registry()
    inspected = [(path, inspect_file(path, registry)) for path in files]
    problems = [p for _, (_, found) in inspected for p in found]
    for problem in problems:
        click.echo(problem, err=True)
    if problems:
        raise UsageError(f"{len(problems)} problem(s) found; fix them and run again")
    click.echo(f"ok: {len(files)} runbook file(s) are valid")
    if scenarios_dir.is_dir():
        hypotheses = [(path.name, h.cause) for path, (loaded, _) in inspected if loaded
                      for h in loaded.runbook.hypotheses]  # fmt: skip
        _unexercised(hypotheses, scenarios_dir)


def _unexercised(hypotheses: list[tuple[str, str]], scenarios_dir: Path) -> None:
    """Say which hypotheses no eval scenario exercises: none names their cause as its cause,
    a related one, or one to rule out, so no run checks that the hypothesis can be right."""
    from bot.eval import load_catalogue

    scenarios = load_catalogue(scenarios_dir)
    exercised = {c for s in scenarios
                 for c in (*s.truth.causes, *s.truth.related, *s.truth.ruled_out)}  # fmt: skip
    idle = [f"{cause} ({name})" for name, cause in hypotheses if cause not in exercised]
    if idle:
        click.echo(f"not exercised by any of the {len(scenarios)} scenarios in {scenarios_dir}: "
                   + ", ".join(idle))  # fmt: skip
    else:
        click.echo(f"every hypothesis is exercised by the {len(scenarios)} scenarios in "
                   f"{scenarios_dir}")  # fmt: skip


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
