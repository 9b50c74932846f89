"""`ruleloop eval`: run the catalogue of induced incidents on real local engines and grade the
diagnosis of each (bot/eval/). Exit codes: 0 the run finished (its grades are in the table),
1 the mean cause grade fell under --min-grade, 2 bad input (a scenario file, a directory)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from bot.kernel import RuleloopError

EPILOG = """\b
Each scenario is a small YAML file (bench/incidents/README.md): the engine's flags, the load
(client streams sized from what the engine was measured to do), a fault, and the truth (the
cause, the causes that must be ruled out, those the data cannot decide, the ADR to offer).
Each engine starts once per group of scenarios that share its flags; a chat alone and the
longest whole-step prompt alone are timed on it, and every window is a multiple of those.

\b
Examples:
  ruleloop eval --subset fast              the CI subset (about a minute on 2 AVX-512 cores)
  ruleloop eval                            the whole catalogue (make eval)
  ruleloop eval --only queueing --only kv-pressure
  ruleloop eval --scenarios my-incidents/ --runbooks my-runbooks/   your own, after a change

\b
Grades: 100 the right cause, 65 its family, 35 a related cause, 20 abstained when there was a
cause (100 when there was none), 0 wrong. docs/evaluation.md has the latest full table.
"""


class BelowGrade(RuleloopError):
    """The run's mean cause grade is under the floor asked for."""

    exit_code = 1


@click.command("eval", epilog=EPILOG)
@click.option(
    "--scenarios",
    "scenarios_dir",
    type=click.Path(path_type=Path),
    default=Path("bench/incidents"),
    show_default=True,
    help="The directory of scenario files.",
)
@click.option(
    "--subset",
    type=click.Choice(["fast", "full"]),
    default="full",
    show_default=True,
    help="fast: the scenarios marked subset: fast (CI); full: all of them.",
)
@click.option("--only", multiple=True, metavar="NAME", help="Run only these scenarios.")
@click.option(
    "--runbooks",
    "runbooks_dir",
    type=click.Path(path_type=Path),
    default=Path("runbooks"),
    show_default=True,
    help="The runbooks to diagnose with.",
)
@click.option(
    "--adrs",
    "adrs_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="The ADRs a diagnosis may offer, and the fixes scenarios try (default: the "
    "scenarios' own adr/ directory).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=Path("bench/results/eval"),
    show_default=True,
    help="Where the dated table goes (eval-<date>.md and .json).",
)
@click.option(
    "--min-grade",
    type=click.FloatRange(0, 100),
    default=None,
    help="Exit 1 when the mean cause grade is under this.",
)
def eval_cmd(scenarios_dir: Path, subset: str, only: tuple[str, ...], runbooks_dir: Path,
             adrs_dir: Path | None, out_dir: Path, min_grade: float | None) -> None:  # fmt: skip
    """Grade the diagnosis on a catalogue of incidents induced on real local vLLM engines."""
    from bot.adr import AdrStore
    from bot.diagnosis.runbooks import default_registry, load_dir
    from bot.engine import default_state_dir
    from bot.eval import load_catalogue, markdown, report, run_catalogue

    scenarios = load_catalogue(scenarios_dir, subset=subset, only=list(only))
    adrs_dir = adrs_dir or scenarios_dir / "adr"
    runbooks = load_dir(runbooks_dir, default_registry())
    which = "only " + ", ".join(only) if only else subset
    click.echo(f"ruleloop eval: {len(scenarios)} scenarios ({which}), runbooks {runbooks_dir}/, "
               f"ADRs {adrs_dir}/")  # fmt: skip
    ran = run_catalogue(scenarios, runbooks=runbooks, adrs=AdrStore(root=adrs_dir),
                        state_dir=default_state_dir() / "eval", echo=click.echo)  # fmt: skip
    result = report([r.graded for r in ran], subset="only" if only else subset)
    table = markdown(result)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"eval-{result.at:%Y%m%d-%H%M%S}"
    stem.with_suffix(".md").write_text(table)
    stem.with_suffix(".json").write_text(json.dumps(result.model_dump(mode="json"), indent=2))
    click.echo("\n" + table)
    click.echo(f"written: {stem}.md, {stem}.json")
    if min_grade is not None and result.summary.mean_grade < min_grade:
        raise BelowGrade(f"mean cause grade {result.summary.mean_grade:.1f} is under "
                         f"--min-grade {min_grade:g}")  # fmt: skip


def register(cli: click.Group) -> None:
    """Add `eval` to the ruleloop command line."""
    cli.add_command(eval_cmd)
