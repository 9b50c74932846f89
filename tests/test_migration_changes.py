"""Every change to a target in one table (migration 0015, issue 40), on SQLite and a real
PostgreSQL: a database holding 0014's remediations and tune_sessions (a drift before-run among
them) upgrades with every row kept, remediations under their ids (their buttons and canary
results still point at them), tuning sessions renumbered after them with the renumbering
audited; the one index then holds a target against every kind; and it downgrades back."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from bot.change import exclusion
from bot.kernel.store.db import Database
from bot.kernel.store.models import (
    AuditEntry,
    CanaryResult,
    Change,
    DriftBeforeRun,
    Remediation,
    TuneSession,
    UTCDateTime,
)
from tests.test_bot_store import postgres  # noqa: F401  (the real PostgreSQL server fixture)
from tests.test_migrations import empty  # noqa: F401  (an empty database on each backend)

AT = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


SHARED = [sa.column("target"), sa.column("state"), sa.column("requested_by"),
          sa.column("approved_by", sa.JSON()), sa.column("before", sa.JSON()),
          sa.column("result", sa.JSON()), sa.column("created_at", UTCDateTime()),
          sa.column("updated_at", UTCDateTime()), sa.column("runner"),
          sa.column("heartbeat_at", UTCDateTime())]  # fmt: skip


def remediations_0014() -> sa.TableClause:
    return sa.table(
        "remediations", sa.column("id"), *[sa.column(c.name, c.type) for c in SHARED],
        sa.column("incident_id"), sa.column("adr_id"), sa.column("approvals_needed"),
        sa.column("change", sa.JSON()), sa.column("after", sa.JSON()), sa.column("channel"),
        sa.column("ts"), sa.column("silence", sa.JSON()),
    )  # fmt: skip


def tune_sessions_0014() -> sa.TableClause:
    return sa.table(
        "tune_sessions", sa.column("id"), *[sa.column(c.name, c.type) for c in SHARED],
        sa.column("plan", sa.JSON()), sa.column("trial", sa.JSON()),
    )  # fmt: skip


def shared(target: str, state: str, **extra: object) -> dict[str, object]:
    return {"target": target, "state": state, "requested_by": "U1", "approved_by": ["U2"],
            "before": {"flags": {"max-num-seqs": 4}}, "result": {}, "created_at": AT,
            "updated_at": AT, "runner": None, "heartbeat_at": None, **extra}  # fmt: skip


def fill_0014(connection: sa.Connection) -> None:
    """Two remediations (one promoted with a canary result, one pending), a finished tuning
    session, and a drift before-run still running (its process died)."""
    connection.execute(
        sa.text("INSERT INTO incidents (id, key, source, status, title, target, labels, "
                "opened_at, summary) VALUES (1, 'k', 'slash', 'firing', 't', 'prod-a', '{}', "
                ":at, '{}')"), {"at": AT},
    )  # fmt: skip
    rem = {"incident_id": 1, "adr_id": "ADR-20260831-01", "approvals_needed": 1,
           "change": {"max-num-batched-tokens": 512}, "after": {"flags": {}},
           "channel": "C1", "ts": "1.2", "silence": None}  # fmt: skip
    connection.execute(remediations_0014().insert(), [
        {"id": 1, **shared("prod-a", "promoted", **rem)},
        {"id": 2, **shared("prod-b", "pending", **rem)},
    ])  # fmt: skip
    connection.execute(tune_sessions_0014().insert(), [
        {"id": 1, **shared("prod-a", "restored", plan={"space": {}}, trial={})},
        {"id": 2, **shared("prod-c", "running", plan={"drift_before_run": "ADR-x"},
                           trial={"n": 1})},
    ])  # fmt: skip
    connection.execute(
        sa.text("INSERT INTO canary_results (incident_id, remediation_id, label, passed, "
                "report, at) VALUES (1, 1, 'after', true, '{}', :at)"), {"at": AT},
    )  # fmt: skip


def test_both_tables_move_into_changes_and_back(empty: Database) -> None:  # noqa: F811
    if empty.url.get_backend_name() == "sqlite":  # as create_schema does before migrating
        Path(str(empty.url.database)).parent.mkdir(parents=True)
    empty.migrate("0014")
    with empty.engine.begin() as connection:
        fill_0014(connection)
    empty.migrate("head")

    with empty.transaction() as s:
        rows = s.scalars(select(Change).order_by(Change.id)).all()
        assert [(r.id, r.kind, r.target, r.state) for r in rows] == [
            (1, "remediation", "prod-a", "promoted"),
            (2, "remediation", "prod-b", "pending"),
            (3, "tuning", "prod-a", "restored"),
            (4, "drift_before_run", "prod-c", "running"),
        ]
        assert [type(r) for r in rows] == [Remediation, Remediation, TuneSession, DriftBeforeRun]
        assert rows[0].change == {"max-num-batched-tokens": 512} and rows[0].ts == "1.2"
        assert rows[3].trial == {"n": 1} and rows[3].before == {"flags": {"max-num-seqs": 4}}
        (canary,) = s.scalars(select(CanaryResult)).all()
        assert canary.remediation_id == 1
        renumbered = s.scalars(
            select(AuditEntry).where(AuditEntry.action == "change.renumbered")
        ).all()
        assert sorted((a.detail["tune_session"], a.detail["change"]) for a in renumbered) == [
            (1, 3), (2, 4),
        ]  # fmt: skip
        # one table, one hold: prod-b (a pending remediation) and prod-c (a running before-run)
        # are held against every kind
        assert exclusion.holder(s, "prod-b") is not None
        held = exclusion.holder(s, "prod-c")
        assert held is not None and held.kind == "tuning" and held.id == 4
        assert exclusion.holder(s, "prod-a") is None
    with pytest.raises(IntegrityError), empty.transaction() as s:
        s.add(TuneSession(**shared("prod-b", "running", plan={}, trial={})))
    with empty.transaction() as s:  # the id sequence continues past the moved rows
        s.add(added := TuneSession(**shared("prod-a", "running", plan={}, trial={})))
        s.flush()
        assert added.id > 4  # PostgreSQL: the refused insert above may have used 5
        new_id = added.id

    with empty.engine.begin() as connection:
        command.downgrade(empty.alembic_config(connection), "0014")
        rems = connection.execute(sa.text("SELECT id, state FROM remediations ORDER BY id"))
        assert [tuple(r) for r in rems] == [(1, "promoted"), (2, "pending")]
        tunes = connection.execute(sa.text("SELECT id, state FROM tune_sessions ORDER BY id"))
        assert [tuple(r) for r in tunes] == [(3, "restored"), (4, "running"), (new_id, "running")]
        link = connection.execute(sa.text("SELECT remediation_id FROM canary_results"))
        assert [r[0] for r in link] == [1]
    empty.migrate("head")  # and up again
    with empty.transaction() as s:
        assert len(s.scalars(select(Change)).all()) == 5


def test_a_held_change_holds_its_target_and_goes_back_as_rolling_back(  # migration 0016
    empty: Database,  # noqa: F811
) -> None:
    if empty.url.get_backend_name() == "sqlite":
        Path(str(empty.url.database)).parent.mkdir(parents=True)
    empty.migrate("head")
    rem = {"incident_id": None, "adr_id": "ADR-20260831-01", "approvals_needed": 1,
           "change": {}, "after": {"flags": {}}, "channel": None, "ts": None}  # fmt: skip
    with empty.transaction() as s:
        s.add(Remediation(**shared("prod-a", "held", **rem)))
    with empty.transaction() as s:
        held = exclusion.holder(s, "prod-a")
        assert held is not None and held.state == "held"
    with pytest.raises(IntegrityError), empty.transaction() as s:
        s.add(TuneSession(**shared("prod-a", "running", plan={}, trial={})))
    with empty.engine.begin() as connection:
        command.downgrade(empty.alembic_config(connection), "0015")
        states = connection.execute(sa.text("SELECT state FROM changes"))
        assert [r[0] for r in states] == ["rolling_back"]  # the older bot's resume rolls it back
    with pytest.raises(IntegrityError), empty.transaction() as s:  # and it still holds
        s.add(TuneSession(**shared("prod-a", "running", plan={}, trial={})))
