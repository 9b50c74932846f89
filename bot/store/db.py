"""The database: engine, transactions, schema creation, and the audit log's append-only guard.

The audit log is append-only twice over: the ORM refuses to flush an update or delete of an
``AuditEntry``, and on SQLite and PostgreSQL a trigger refuses it in the database itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import DDL, create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from bot.errors import UsageError
from bot.store.models import AuditEntry, Base

_SQLITE_GUARD = """
CREATE TRIGGER IF NOT EXISTS audit_log_append_only_{op} BEFORE {op} ON audit_log
BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END
"""
_PG_GUARD = """
CREATE OR REPLACE FUNCTION audit_log_append_only() RETURNS trigger AS $$
BEGIN RAISE EXCEPTION 'audit_log is append-only'; END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS audit_log_append_only ON audit_log;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
"""

for _op in ("UPDATE", "DELETE"):
    event.listen(
        AuditEntry.__table__,
        "after_create",
        DDL(_SQLITE_GUARD.format(op=_op)).execute_if(dialect="sqlite"),
    )
event.listen(AuditEntry.__table__, "after_create", DDL(_PG_GUARD).execute_if(dialect="postgresql"))


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
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        else:
            kwargs["pool_pre_ping"] = True
        self.url = parsed
        self.engine: Engine = create_engine(parsed, **kwargs)
        if parsed.get_backend_name() == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
            event.listen(self.engine, "begin", _sqlite_begin_immediate)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def create_schema(self) -> None:
        """Create missing tables (and the audit guard); UsageError when the database is unusable."""
        where = self.url.render_as_string(hide_password=True)
        try:
            if self.url.get_backend_name() == "sqlite" and self.url.database not in (
                None,
                "",
                ":memory:",
            ):
                Path(self.url.database).parent.mkdir(parents=True, exist_ok=True)
            Base.metadata.create_all(self.engine)
        except OSError as exc:
            raise UsageError(f"cannot open the incident store {where}: {exc}") from None
        except OperationalError as exc:
            raise UsageError(f"cannot open the incident store {where}: {exc.orig}") from None

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
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.close()


def _sqlite_begin_immediate(connection: Any) -> None:
    # Take the write lock when the unit of work starts: a read-then-write transaction that
    # found another writer's commit in between would fail with "database is locked" instead.
    connection.exec_driver_sql("BEGIN IMMEDIATE")
