"""The database: engine, transactions, schema migrations, and the audit log's append-only guard.

The schema is Alembic's (``bot/kernel/store/migrations``): ``create_schema`` upgrades any database
to the newest revision, an empty one included. On PostgreSQL the upgrade holds an advisory lock, so
replicas starting at once migrate one after the other (the later ones find nothing to do).

The audit log is append-only twice over: the ORM refuses to flush an update or delete of an
``AuditEntry``, and on SQLite and PostgreSQL a trigger (made by the first migration) refuses it
in the database itself.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from bot.kernel.errors import UsageError
from bot.kernel.store.models import AuditEntry

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_S = 30  # how long a SQLite statement waits for another writer
MIGRATION_LOCK = 0x72756C65  # pg_advisory_xact_lock key of schema upgrades ("rule")


class AppendOnlyError(RuntimeError):
    """Someone tried to change or remove an audit entry."""


@event.listens_for(Session, "before_flush")
def _refuse_audit_changes(session: Session, _ctx: Any, _instances: Any) -> None:
    for obj in (*session.dirty, *session.deleted):
        if isinstance(obj, AuditEntry) and (obj in session.deleted or session.is_modified(obj)):
            raise AppendOnlyError("the audit log is append-only")


class Database:
    """One SQLAlchemy engine and its session factory; ``transaction()`` is the unit of work."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        try:
            parsed = make_url(url)
        except ArgumentError as exc:
            raise UsageError(f"bad database URL {url!r}: {exc}") from None
        kwargs: dict[str, Any] = {"echo": echo}
        if parsed.get_backend_name() == "sqlite":
            # Used from the event loop's worker threads; every unit of work is its own session.
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S}
        else:
            kwargs["pool_pre_ping"] = True
        self.url = parsed
        self.engine: Engine = create_engine(parsed, **kwargs)
        if parsed.get_backend_name() == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
            event.listen(self.engine, "begin", _sqlite_begin_immediate)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def create_schema(self) -> None:
        """Upgrade the schema to the newest migration (an empty database gets all of it).

        UsageError when the database cannot be opened.
        """
        where = self.url.render_as_string(hide_password=True)
        try:
            if self.url.get_backend_name() == "sqlite" and self.url.database not in (
                None,
                "",
                ":memory:",
            ):
                Path(self.url.database).parent.mkdir(parents=True, exist_ok=True)
            self.migrate("head")
        except OSError as exc:
            raise UsageError(f"cannot open the incident store {where}: {exc}") from None
        except OperationalError as exc:
            raise UsageError(f"cannot open the incident store {where}: {exc.orig}") from None

    def migrate(self, revision: str = "head") -> None:
        """Upgrade to ``revision`` in one transaction (serialized across replicas on PostgreSQL)."""
        from alembic import command

        with self.engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK}
                )
            command.upgrade(self.alembic_config(connection), revision)

    def revision(self) -> str | None:
        """The schema revision the database is at (None: never migrated)."""
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()

    def alembic_config(self, connection: Connection) -> Config:
        """An Alembic config that migrates ``connection`` with the package's migrations."""
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
        config.attributes["connection"] = connection
        return config

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session whose work commits together on success and rolls back on any error."""
        with self._sessions() as session, session.begin():
            yield session

    def dispose(self) -> None:
        """Close pooled connections."""
        self.engine.dispose()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy, not the sqlite3 module, decide when transactions begin (see below).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    if cursor.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        _switch_to_wal(cursor)
    cursor.close()


def _switch_to_wal(cursor: Any) -> None:
    # SQLite answers a journal-mode change "database is locked" at once, without waiting on the
    # busy timeout, while another connection writes (replicas creating one new file together);
    # wait for the writer here as long as any other statement would.
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _sqlite_begin_immediate(connection: Any) -> None:
    # Take the write lock when the unit of work starts: a read-then-write transaction that
    # found another writer's commit in between would fail with "database is locked" instead.
    connection.exec_driver_sql("BEGIN IMMEDIATE")
