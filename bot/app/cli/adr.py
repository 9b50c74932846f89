"""`ruleloop adr list|show|new|validate|match|export|stats`: the decision records.

`list`, `show` and `match` read the store the bot shares between its replicas when a database is
configured ([store] url or $RULELOOP_DATABASE_URL), else the files under --adr-dir. `new` and
`validate` work on files (for git); `export` writes the store's records as those files; `stats`
counts what the incident store says happened to each ADR.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click
import sqlalchemy as sa
import yaml
from sqlalchemy.exc import SQLAlchemyError

from bot.adr import (
    METRICS,
    NORMAL_METRICS,
    Adr,
    AdrStore,
    Cause,
    SharedAdrStore,
    default_checker,
    known,
    matching,
    read_report,
    to_argv,
    vllm_args,
)
from bot.adr.match import match
from bot.adr.validate import validate
from bot.app.cli.options import config_option
from bot.kernel import AdrError, UsageError

if TYPE_CHECKING:
    from bot.kernel import Settings
    from bot.kernel.store import Database

adr_dir_option = click.option(
    "--adr-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="RULELOOP_ADR_DIR",
    default=Path("adr"),
    show_default=True,
    help="The decision store: ADRs here, drafts in its drafts/.",
)
config = config_option(
    "TOML settings (default: $RULELOOP_CONFIG): with [store] url (or "
    "$RULELOOP_DATABASE_URL) the store's ADRs are read, not --adr-dir's files."
)
state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where `ruleloop serve` keeps its SQLite store, when no [store] url is configured.",
)
date_option = click.option(
    "--date",
    "day",
    type=click.DateTime(formats=["%Y-%m-%d"]),
    default=None,
    help="The ADR's date and id day [default: today].",
)


def today(day: dt.datetime | None) -> dt.date:
    """The date given on the command line, else the local date."""
    return day.date() if day is not None else dt.date.today()


@click.group("adr")
def adr() -> None:
    """Architecture decision records: the pre-approved fixes, as validated Markdown.

    \b
    Examples:
      ruleloop adr list
      ruleloop adr show ADR-20260831-01
      ruleloop adr validate adr/
      ruleloop adr match canary.json      which accepted ADRs fit these numbers
      ruleloop adr new --title "Prefix caching for agent prompts"
      ruleloop adr export adr/            the store's ADRs as files, for git
      ruleloop adr stats --days 7         per ADR: matched, applied, kept, recurred
    """


@adr.command("list")
@click.option(
    "--status", type=click.Choice(["proposed", "accepted", "superseded", "rejected"]), default=None
)
@click.option("--drafts/--no-drafts", default=True, show_default=True, help="Include drafts.")
@adr_dir_option
@config
def list_(status: str | None, drafts: bool, adr_dir: Path, config_path: Path | None) -> None:
    """List the ADRs: id, status, date, title and file (or place in the store)."""
    with _store(adr_dir, config_path) as store:
        entries = [
            (p, a)
            for p, a in store.entries(include_drafts=drafts)
            if status is None or a.status == status
        ]
        where = _where(store)
    if not entries:
        click.echo(f"no ADRs {where}" + (f" with status {status}" if status else ""))
        return
    shared = isinstance(store, SharedAdrStore)
    for path, record in entries:
        place = f"store: {path}" if shared else str(path)
        click.echo(f"{record.id}  {record.status:<10}  {record.date}  {record.title}  ({place})")


@adr.command("show")
@click.argument("adr_id")
@click.option("--json", "as_json", is_flag=True, help="The record as JSON.")
@adr_dir_option
@config
def show(adr_id: str, as_json: bool, adr_dir: Path, config_path: Path | None) -> None:
    """Print one ADR and the vLLM flags its fix applies."""
    with _store(adr_dir, config_path) as store:
        record = store.get_or_raise(adr_id)
        if isinstance(store, SharedAdrStore):
            row = store.row(adr_id)
            assert row is not None
            text = row.text
        else:
            found = store.find(adr_id)
            assert found is not None
            text = found[0].read_text(encoding="utf-8")
    argv = to_argv(record.fix.engine_args)
    if as_json:
        click.echo(
            json.dumps(
                record.model_dump(mode="json") | {"engine_argv": argv}, indent=2, ensure_ascii=False
            )
        )
        return
    click.echo(text)
    click.echo(f"engine argv: {' '.join(argv) or '(no engine flags)'}")


@adr.command("new")
@click.option("--title", required=True, help="One line: what is being decided.")
@click.option(
    "--slug", default=None, help="File-name slug [default: from the title's ASCII words]."
)
@click.option("--decider", "deciders", multiple=True, help="Who decides (repeat).")
@click.option("--supersedes", multiple=True, help="An ADR id this one replaces (repeat).")
@date_option
@adr_dir_option
def new(
    title: str,
    slug: str | None,
    deciders: tuple[str, ...],
    supersedes: tuple[str, ...],
    day: dt.datetime | None,
    adr_dir: Path,
) -> None:
    """Write a proposed ADR skeleton into adr/drafts/ and print its path."""
    store = AdrStore(root=adr_dir)
    date = today(day)
    record = Adr(
        id=store.next_id(date),
        title=title,
        status="proposed",
        date=date,
        deciders=list(deciders),
        supersedes=list(supersedes),
        context="TODO: what happened, under which load, with numbers (P99, goodput, concurrency).",
        rules=["TODO: the rule, with the exact flag or gateway setting it fixes."],
    )
    path = store.write_draft(record, slug=slug)
    click.echo(str(path))
    click.echo(
        "next: measure the configurations with `ruleloop tune`, or fill in the matrix by hand",
        err=True,
    )


@adr.command("validate")
@click.argument("path", type=click.Path(path_type=Path), required=False)
@click.option(
    "--vllm/--no-vllm",
    "use_vllm",
    default=None,
    help="Check engine flags with vLLM's own parser [default: when vLLM is installed].",
)
@click.option(
    "--runbooks",
    "runbooks_dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="RULELOOP_RUNBOOKS_DIR",
    default=Path("runbooks"),
    show_default=True,
    help="Runbooks whose `causes:` an ADR's `cause` may name too (beside the built-in ones).",
)
@adr_dir_option
def validate_cmd(
    path: Path | None, use_vllm: bool | None, runbooks_dir: Path, adr_dir: Path
) -> None:
    """Check ADR files (default: the whole store): schema, ids, supersedes, gates, engine
    flags, cause names."""
    target = path or adr_dir
    if use_vllm and not vllm_args.available():
        raise UsageError("--vllm needs vLLM installed in this Python: pip install -e '.[engine]'")
    checker = default_checker(use_vllm)
    causes = known(_declared_causes(runbooks_dir))
    problems = validate(target, checker=checker, causes=causes)
    for problem in problems:
        click.echo(str(problem), err=True)
    if problems:
        raise AdrError(
            f"{len(problems)} problem(s) found; fix them and run again", file=str(target)
        )
    how = f"vLLM {vllm_args.version()}'s parser" if checker else "the allowlist only"
    click.echo(f"ok: {target} is valid (engine flags checked against {how})")


@adr.command("match")
@click.argument(
    "report_path", metavar="METRICS.json", type=click.Path(dir_okay=False, path_type=Path)
)
@click.option("--json", "as_json", is_flag=True, help="The matching ADRs as JSON.")
@click.option(
    "--normal", "normal_path", metavar="NORMAL.json",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A report of the same kind measured on a normal day: relative conditions "
    "('3x normal') are multiplied out with its numbers. Without it they do not hold.",
)  # fmt: skip
@adr_dir_option
@config
def match_cmd(
    report_path: Path,
    as_json: bool,
    normal_path: Path | None,
    adr_dir: Path,
    config_path: Path | None,
) -> None:
    """List the accepted ADRs whose `match` conditions all hold for a canary or diagnosis report.

    \b
    ruleloop adr match canary.json
    ruleloop adr match canary.json --normal canary-normal.json   # for '3x normal' conditions
    """
    report = read_report(_read_report(report_path))
    normal = None
    if normal_path is not None:
        normal = read_report(_read_report(normal_path)).pick({m: m for m in NORMAL_METRICS})
        if not normal.readings:
            raise UsageError(
                f"{normal_path}: none of {', '.join(NORMAL_METRICS)} is in this report; "
                "pass a canary --output-json or a diagnosis report measured on a normal day"
            )
    with _store(adr_dir, config_path) as store:
        accepted = store.accepted()
    results = matching(accepted, report, normal)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "id": r.adr.id,
                        "title": r.adr.title,
                        "engine_argv": to_argv(r.adr.fix.engine_args),
                        "conditions": [c.explain() for c in r.conditions],
                    }
                    for r in results
                ],
                indent=2,
                ensure_ascii=False,
            )
        )
        return
    for result in results:
        click.echo(f"{result.adr.id}  {result.adr.title}")
        for condition in result.conditions:
            click.echo(f"  {condition.explain()}")
        click.echo(f"  fix: {' '.join(to_argv(result.adr.fix.engine_args)) or '(no engine flags)'}")
    if not results:
        click.echo(f"no accepted ADR matches {report_path}")
        for record in accepted:
            missed = [c.explain() for c in match(record, report, normal).conditions if not c.holds]
            if missed:
                click.echo(f"  {record.id}: " + "; ".join(missed))


@adr.command("export")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@config
@state_dir_option
def export(directory: Path, config_path: Path | None, state_dir: Path | None) -> None:
    """Write every ADR in the store (drafts in drafts/) as Markdown files, for git.

    \b
    Each file is the record byte for byte; a file of the same id elsewhere in DIR (the draft
    of an ADR since accepted) is removed; files of ids the store lacks are left alone.
    Example:
      RULELOOP_DATABASE_URL=postgresql+psycopg://ruleloop@db/ruleloop ruleloop adr export adr/
    """
    with _opened(_store_url(config_path, state_dir)) as db:
        done = SharedAdrStore(root=directory, db=db, sync=False).export(directory)
    for path in done.written:
        click.echo(f"wrote {path}")
    for path in done.removed:
        click.echo(f"removed {path} (its id is written elsewhere)")
    click.echo(
        f"{len(done.written)} written, {len(done.unchanged)} unchanged, "
        f"{len(done.removed)} removed in {directory}"
    )


@adr.command("stats")
@click.option(
    "--days", type=click.IntRange(min=1), default=7, show_default=True,
    help="A kept change 'recurred' when its cause came back on its target within this many days.",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="The counts as JSON.")
@config
@state_dir_option
def stats_cmd(days: int, as_json: bool, config_path: Path | None, state_dir: Path | None) -> None:
    """Per ADR: how often it was matched, applied, kept, rolled back, recurred within --days,
    and how often on-call confirmed or marked wrong the cause of the threads that offered it.

    \b
    Example:
      ruleloop adr stats --days 14
    """
    from bot.incidents import stats

    with _opened(_store_url(config_path, state_dir)) as db:
        if not sa.inspect(db.engine).has_table("cause_feedback"):
            raise UsageError("the store predates cause feedback: run `ruleloop db upgrade`")
        records, _ = SharedAdrStore(root=Path("adr"), db=db, sync=False).scan(include_drafts=True)
        with db.transaction() as s:
            rows = stats.collect(s, days=days, causes_of={a.id: a.cause for a in records})
    if as_json:
        click.echo(json.dumps(stats.as_json(rows, days=days), indent=2))
    else:
        click.echo(stats.table(rows, days=days))


def _declared_causes(directory: Path) -> dict[str, Cause]:
    """The causes the runbook files under ``directory`` declare (``causes:``); a file that does
    not read is skipped here (`ruleloop runbooks validate` says why)."""
    found: dict[str, Cause] = {}
    for path in sorted(directory.glob("*.y*ml")) if directory.is_dir() else []:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        declared = data.get("causes") if isinstance(data, dict) else None
        for entry in declared if isinstance(declared, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                found[entry["name"]] = Cause(entry["name"], str(entry.get("title", "")))
    return found


def _store_url(config_path: Path | None, state_dir: Path | None) -> str:
    """[store] url, else the SQLite store `ruleloop serve` keeps under its state directory."""
    from bot.engine import default_state_dir

    settings = _settings(config_path)
    if settings.store.url:
        return settings.store.url
    sqlite = (settings.paths.state or state_dir or default_state_dir()) / "ruleloop.db"
    if not sqlite.is_file():
        raise UsageError(
            f"no store at {sqlite}: set [store] url (or $RULELOOP_DATABASE_URL), or "
            "--state-dir where `ruleloop serve` keeps its ruleloop.db"
        )
    return f"sqlite:///{sqlite}"


def _settings(config_path: Path | None) -> Settings:
    from bot.kernel import Settings

    return Settings.load(os.environ, path=config_path)


@contextlib.contextmanager
def _store(adr_dir: Path, config_path: Path | None) -> Iterator[AdrStore]:
    """The store's ADRs when a database is configured, else the files under ``adr_dir``."""
    url = _settings(config_path).store.url
    if not url:
        yield AdrStore(root=adr_dir)
        return
    with _opened(url) as db:
        yield SharedAdrStore(root=adr_dir, db=db, sync=False)  # read only: imports are the bot's


@contextlib.contextmanager
def _opened(url: str) -> Iterator[Database]:
    """The database at ``url``, refused with what to do when it holds no ADR tables."""
    from bot.kernel.store import Database

    db = Database(url)
    where = db.url.render_as_string(hide_password=True)
    try:
        try:
            ready = sa.inspect(db.engine).has_table("adr_records")
        except SQLAlchemyError as exc:
            raise UsageError(
                f"cannot open the store {where}: {getattr(exc, 'orig', exc)}"
            ) from None
        if not ready:
            raise UsageError(
                f"the store {where} has no ADR tables yet: run `ruleloop db upgrade` (or start "
                "`ruleloop serve`, which also imports its adr/)"
            )
        yield db
    finally:
        db.dispose()


def _where(store: AdrStore) -> str:
    if isinstance(store, SharedAdrStore):
        return f"in the store {store.db.url.render_as_string(hide_password=True)}"
    return f"under {store.root}"


def _read_report(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: cannot read a JSON report: {exc}") from exc
    if not isinstance(data, dict):
        raise UsageError(
            f"{path}: a report is a JSON object (canary --output-json, or a diagnosis with "
            f"'metrics': {{name: number}}; names: {', '.join(METRICS)})"
        )
    return data


def register(cli: click.Group) -> None:
    """Add `adr` to the ruleloop command line."""
    cli.add_command(adr)
