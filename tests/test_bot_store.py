"""The incident store on SQLite: schema, transactions, and the append-only audit log."""

from __future__ import annotations

import datetime as dt
import functools
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DatabaseError, IntegrityError

from bot.engine.process import free_port
from bot.incidents.intake.models import parse_webhook
from bot.incidents.intake.service import Intake, IntakeOutcome
from bot.kernel.config import Target
from bot.kernel.errors import UsageError
from bot.kernel.store import service as store
from bot.kernel.store.db import AppendOnlyError, Database
from tests import store_reads

T0 = dt.datetime(2026, 9, 1, 2, 13, tzinfo=dt.UTC)


PG_BIN = max(Path("/usr/lib/postgresql").glob("*/bin"), default=Path("/nonexistent"))


def new_database(server: str, *, prefix: str = "t") -> str:
    """The URL of a new, empty database on the PostgreSQL ``server``."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f"CREATE DATABASE {name}"))
    admin.dispose()
    return f"{server}/{name}"


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL server (Debian's package) on a free loopback port."""
    if not (PG_BIN / "initdb").exists():
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    import pwd

    root = Path(tempfile.mkdtemp(prefix="ruleloop-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    data = root / "data"
    run = functools.partial(subprocess.run, check=True, capture_output=True, timeout=120)
    run([*as_user, str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"])
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off"
    run(
        [
            *as_user,
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(root / "log"),
            "-w",
            "start",
        ]
    )
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}"
    finally:
        subprocess.run(
            [*as_user, str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True,
            timeout=120,
        )
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A fresh, empty store on each backend."""
    if request.param == "sqlite":
        database = Database(f"sqlite:///{tmp_path / 'state' / 'incidents.db'}")
    else:
        server = request.getfixturevalue("postgres")
        database = Database(new_database(server, prefix="t"))
    database.create_schema()
    yield database
    database.dispose()


def _incident(db: Database, key: str = "g1") -> int:
    with db.transaction() as s:
        incident = store.create(
            s, key=key, source="alertmanager", title="t", target=None, labels={"a": "b"}, at=T0
        )
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
        assert store_reads.incidents(s) == [] and store_reads.audit_trail(s) == []


def test_audit_log_is_append_only(db: Database) -> None:
    with db.transaction() as s:
        store.audit(s, at=T0, actor="U1", action="incident.opened", detail={"n": 1})
    with pytest.raises(AppendOnlyError), db.transaction() as s:
        store_reads.audit_trail(s)[0].note = "rewritten"
    with pytest.raises(AppendOnlyError), db.transaction() as s:
        s.delete(store_reads.audit_trail(s)[0])
    for statement in ("UPDATE audit_log SET note = 'x'", "DELETE FROM audit_log"):
        with pytest.raises(DatabaseError, match="append-only"), db.transaction() as s:
            s.execute(text(statement))
    with db.transaction() as s:
        (entry,) = store_reads.audit_trail(s)
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


def test_intake_racing_twins_on_each_backend(db: Database) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tests.fakes.alerts import alert, body

    intake = Intake(db=db, targets={"a": Target(vllm_url="http://10.0.0.5:8000")}, clock=lambda: T0)
    hook = parse_webhook(body(alert()))
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: intake.receive(hook), range(8)))
    assert [r.outcome for r in results].count(IntakeOutcome.OPENED) == 1
    with db.transaction() as s:
        assert len(store_reads.incidents(s)) == 1
