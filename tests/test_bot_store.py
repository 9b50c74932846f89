"""The incident store on SQLite: schema, transactions, and the append-only audit log."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DatabaseError, IntegrityError

from bot.errors import UsageError
from bot.store import service as store
from bot.store.db import AppendOnlyError, Database

T0 = dt.datetime(2026, 9, 1, 2, 13, tzinfo=dt.UTC)


@pytest.fixture
def db(tmp_path: Path) -> Database:
    database = Database(f"sqlite:///{tmp_path / 'state' / 'incidents.db'}")
    database.create_schema()
    return database


def _incident(db: Database, key: str = "g1") -> int:
    with db.transaction() as s:
        incident = store.create(s, key=key, source="alertmanager", title="t", target=None,
                                labels={"a": "b"}, at=T0)  # fmt: skip
        return incident.id


def test_store_round_trip_keeps_utc(db: Database) -> None:
    incident_id = _incident(db)
    with db.transaction() as s:
        incident = store.get(s, incident_id)
        assert incident is not None
        assert incident.opened_at == T0 and incident.opened_at.tzinfo is not None
        assert store.find_open(s, key="g1") is incident
        store.close(s, incident, at=T0 + dt.timedelta(minutes=5))
    with db.transaction() as s:
        assert store.find_open(s, key="g1") is None
        assert store.get(s, incident_id).status == "resolved"  # type: ignore[union-attr]


def test_store_one_open_incident_per_group(db: Database) -> None:
    _incident(db)
    with pytest.raises(IntegrityError):
        _incident(db)


def test_store_transaction_rolls_back_everything(db: Database) -> None:
    with pytest.raises(RuntimeError), db.transaction() as s:
        incident = store.create(
            s, key="g2", source="slash", title="t", target=None, labels={}, at=T0
        )
        store.audit(s, at=T0, actor="u", action="x", incident=incident)
        raise RuntimeError("boom")
    with db.transaction() as s:
        assert store.incidents(s) == [] and store.audit_trail(s) == []


def test_audit_log_is_append_only(db: Database) -> None:
    with db.transaction() as s:
        store.audit(s, at=T0, actor="U1", action="incident.opened", detail={"n": 1})
    with pytest.raises(AppendOnlyError), db.transaction() as s:
        store.audit_trail(s)[0].note = "rewritten"
    with pytest.raises(AppendOnlyError), db.transaction() as s:
        s.delete(store.audit_trail(s)[0])
    for statement in ("UPDATE audit_log SET note = 'x'", "DELETE FROM audit_log"):
        with pytest.raises(DatabaseError, match="append-only"), db.transaction() as s:
            s.execute(text(statement))
    with db.transaction() as s:
        (entry,) = store.audit_trail(s)
        assert (entry.action, entry.detail, entry.note) == ("incident.opened", {"n": 1}, "")


def test_store_naive_datetime_refused(db: Database) -> None:
    with pytest.raises(Exception, match="naive datetime"), db.transaction() as s:
        store.audit(s, at=dt.datetime(2026, 1, 1), actor="u", action="x")


def test_store_unusable_url_is_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="bad database URL"):
        Database("not a url")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="cannot open the incident store"):
        Database(f"sqlite:///{blocker}/x.db").create_schema()
