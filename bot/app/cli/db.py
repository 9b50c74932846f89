"""`ruleloop db`: the incident store's schema (Alembic migrations shipped in the package).

`ruleloop serve` upgrades the store itself when it starts (replicas take turns on PostgreSQL);
these commands do it ahead of a deployment, say where a database stands, and (for developers)
write a new migration from the models.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bot.app.cli.options import config_option
from bot.kernel import UsageError

if TYPE_CHECKING:
    from bot.kernel.store import Database

CONFIG = config_option(
    "TOML settings file (default: $RULELOOP_CONFIG); the store is [store] url or "
    "$RULELOOP_DATABASE_URL."
)
STATE = click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the default SQLite store lives (as for `ruleloop serve`).",
)


def _database(config_path: Path | None, state_dir: Path | None) -> Database:
    from bot.engine import default_state_dir
    from bot.kernel import Settings
    from bot.kernel.store import Database

    settings = Settings.load(os.environ, path=config_path)
    return Database(settings.database_url(fallback_dir=state_dir or default_state_dir()))


def _where(database: Database) -> str:
    return database.url.render_as_string(hide_password=True)


@click.group("db")
def db() -> None:
    """The incident store: upgrade its schema, show its revision, list undelivered Slack
    messages and resend failed ones, write a migration.

    \b
    Examples:
      RULELOOP_DATABASE_URL=postgresql+psycopg://ruleloop@db/ruleloop ruleloop db upgrade
      ruleloop db current --config ruleloop.toml
      ruleloop db deliveries --config ruleloop.toml
      ruleloop db deliveries --config ruleloop.toml --resend 42
    """


@db.command("upgrade")
@CONFIG
@STATE
def upgrade(config_path: Path | None, state_dir: Path | None) -> None:
    """Upgrade the store to the newest schema (what `ruleloop serve` does when it starts)."""
    database = _database(config_path, state_dir)
    try:
        before = _revision(database)
        database.create_schema()
        after = database.revision()
    finally:
        database.dispose()
    if before == after:
        click.echo(f"{_where(database)}: already at revision {after}")
    else:
        click.echo(f"{_where(database)}: upgraded from {before or 'an empty database'} to {after}")


@db.command("current")
@CONFIG
@STATE
def current(config_path: Path | None, state_dir: Path | None) -> None:
    """Print the store's schema revision and the newest one this version ships."""
    database = _database(config_path, state_dir)
    try:
        revision = _revision(database)
    finally:
        database.dispose()
    head = _head()
    state = "up to date" if revision == head else "needs `ruleloop db upgrade`"
    click.echo(f"{_where(database)}: revision {revision or 'none'}, newest {head} ({state})")


@db.command("deliveries")
@CONFIG
@STATE
@click.option("--limit", default=20, show_default=True, help="How many failed messages to list.")
@click.option(
    "--resend",
    "resend_ids",
    type=click.IntRange(1, 2**63 - 1),  # past the store's integers the query itself failed
    multiple=True,
    metavar="ID",
    help="Make failed message ID (as listed) due again; repeatable.",
)
@click.option(
    "--failed", "resend_failed", is_flag=True, help="Make every failed message due again."
)
def deliveries(
    config_path: Path | None,
    state_dir: Path | None,
    limit: int,
    resend_ids: tuple[int, ...],
    resend_failed: bool,
) -> None:
    """Slack messages incidents are still owed, and the ones Slack refused for good (why).

    A failed message is tried again when Alertmanager repeats its incident (or sends it anew),
    or when you resend it: fix what the reason says (the channel, the token, a scope), then
    `--resend ID` (or `--failed` for all of them). A resent message is due at once and the
    running bot's outbox job sends it within [scheduler] outbox_every_s (15 s), in its
    incident's order; a thread message whose incident's first message was refused takes that
    one with it. This command never talks to Slack itself.
    """
    if resend_ids or resend_failed:
        _resend(config_path, state_dir, list(resend_ids), every=resend_failed)
        return
    from bot.kernel.store import outbox as items

    database = _database(config_path, state_dir)
    try:
        _revision(database)
        with database.transaction() as s:
            counts = items.counts(s)
            failed = [(i.id, i.incident_id, i.kind, i.done_at, i.attempts, i.last_error)
                      for i in items.failed(s, limit=limit)]  # fmt: skip
    finally:
        database.dispose()
    click.echo(f"{_where(database)}: {counts['pending']} pending, {counts['failed']} failed")
    for item_id, incident_id, kind, done_at, attempts, why in failed:
        when = f"{done_at:%Y-%m-%d %H:%M} UTC" if done_at else "?"
        click.echo(
            f"  [{item_id}] incident {incident_id} {kind} (failed {when}, {attempts} tries): {why}"
        )
    if failed:
        click.echo("resend one once fixed: ruleloop db deliveries --resend ID (all: --failed)")


def _resend(
    config_path: Path | None, state_dir: Path | None, ids: list[int], *, every: bool
) -> None:
    """Make the chosen failed messages due again, audited; UsageError for an id that is none."""
    import datetime as dt

    from bot.kernel.store import OutboxItem
    from bot.kernel.store import outbox as items
    from bot.kernel.store import service as store

    if ids and every:
        raise UsageError("give --resend ID or --failed, not both")
    database = _database(config_path, state_dir)
    try:
        _revision(database)
        now = dt.datetime.now(dt.UTC)
        with database.transaction() as s:
            if every:
                chosen = items.all_failed(s)
            else:
                chosen = [_failed_item(s.get(OutboxItem, n), n) for n in dict.fromkeys(ids)]
            resent = items.resend(s, chosen, now=now)
            for item in resent:
                store.audit(
                    s, at=now, actor=f"cli:{_user()}", action="slack.delivery_resent",
                    incident=store.get(s, item.incident_id),
                    detail={"item": item.id, "kind": item.kind, "key": item.key},
                )  # fmt: skip
            shown = [(i.id, i.incident_id, i.kind) for i in resent]
    finally:
        database.dispose()
    click.echo(f"{_where(database)}: {len(shown)} message(s) due again")
    for item_id, incident_id, kind in shown:
        click.echo(f"  [{item_id}] incident {incident_id} {kind}")
    if shown:
        click.echo("the running bot's outbox job sends them within [scheduler] outbox_every_s")


def _failed_item(item: object, item_id: int) -> Any:
    """``item`` when it is a failed message; UsageError (exit 2) saying what it is otherwise."""
    from bot.kernel.store import OutboxItem
    from bot.kernel.store import outbox as items

    if not isinstance(item, OutboxItem) or item.kind not in items.MESSAGES:
        raise UsageError(
            f"no Slack message {item_id} in the store: "
            "`ruleloop db deliveries` lists the failed ones with their ids"
        )
    if item.state != items.FAILED:
        states = {items.PENDING: "still pending: the outbox keeps trying it",
                  items.SENT: "already delivered"}  # fmt: skip
        what = states.get(item.state, f"{item.state}, not failed")
        raise UsageError(f"message {item_id} (incident {item.incident_id} {item.kind}) is {what}")
    return item


def _user() -> str:
    """Who resends, for the audit log."""
    import getpass

    try:
        return str(getpass.getuser())
    except (KeyError, OSError):  # no name for this uid (a container)
        return "unknown"


@db.command("revision")
@click.option("-m", "--message", required=True, help="What the migration changes, in words.")
def revision(message: str) -> None:
    """(Developers) Write a migration for what the models changed since the newest one."""
    from alembic import command

    from bot.kernel.store import Database

    with tempfile.TemporaryDirectory() as scratch:
        database = Database(f"sqlite:///{Path(scratch) / 'head.db'}")
        try:
            database.create_schema()
            with database.engine.begin() as connection:
                script = command.revision(
                    database.alembic_config(connection), message, autogenerate=True
                )
        finally:
            database.dispose()
    path = getattr(script, "path", script)
    click.echo(f"wrote {path}: read it, adjust it, and commit it with the model change")


def _revision(database: Database) -> str | None:
    from sqlalchemy.exc import OperationalError

    try:
        return database.revision()
    except OperationalError as exc:
        raise UsageError(f"cannot open the incident store {_where(database)}: {exc.orig}") from None


def _head() -> str | None:
    from alembic.script import ScriptDirectory

    from bot.kernel.store import MIGRATIONS

    return ScriptDirectory(str(MIGRATIONS)).get_current_head()


def register(group: click.Group) -> None:
    """Add `db` to the CLI."""
    group.add_command(db)
