"""changes: every change to a target in one table (a remediation, a tuning session, a drift
before-run, told apart by ``kind``), with one unique index on the target of the changes that hold
it, so one index decides a race of any two kinds (was: two tables, each checking the other
under an advisory lock).

The upgrade moves today's rows: remediations keep their ids (their buttons say
"remediation:ID", canary results point at them); tuning sessions are numbered after them, each
renumbering written to the audit log ("change.renumbered", old and new id), and a session whose
plan names ``drift_before_run`` becomes that kind. canary_results.remediation_id then points at
changes. The downgrade moves them back: remediations to remediations, the other kinds to
tune_sessions, keeping the ids changes gave them.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

IN_FLIGHT = "state IN ('pending', 'approved', 'applying', 'canary', 'promoting', 'rolling_back')"
TUNING = "state IN ('running', 'restoring')"
HOLDS = (
    "state IN ('pending', 'approved', 'applying', 'canary', 'promoting', 'rolling_back', "
    "'running', 'restoring')"
)
# the columns as each table had them at 0014, and the ones every kind shares in changes
SHARED = ("id", "target", "state", "requested_by", "approved_by", "before", "result",
          "created_at", "updated_at", "runner", "heartbeat_at")  # fmt: skip
REMEDIATION = ("incident_id", "adr_id", "approvals_needed", "change", "after", "channel", "ts",
               "silence")  # fmt: skip
TUNE = ("plan", "trial")


def _json(name: str, nullable: bool) -> sa.Column[Any]:
    return sa.Column(name, sa.JSON(), nullable=nullable)


def _time(name: str, nullable: bool) -> sa.Column[Any]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _shared_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("target", sa.String(length=200), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("requested_by", sa.String(length=64), nullable=False),
        _json("approved_by", False), _json("before", False), _json("result", False),
        _time("created_at", False), _time("updated_at", False),
        sa.Column("runner", sa.String(length=200), nullable=True),
        _time("heartbeat_at", True),
    ]  # fmt: skip


def upgrade() -> None:
    """Create changes, move both tables' rows into it, point canary results at it, drop them."""
    op.create_table(
        "changes",
        *_shared_columns(),
        sa.Column("kind", sa.String(length=24), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=True),
        sa.Column("adr_id", sa.String(length=32), nullable=True),
        sa.Column("approvals_needed", sa.Integer(), nullable=True),
        _json("change", True), _json("after", True),
        sa.Column("channel", sa.String(length=64), nullable=True),
        sa.Column("ts", sa.String(length=32), nullable=True),
        _json("silence", True), _json("plan", True), _json("trial", True),
        sa.ForeignKeyConstraint(["incident_id"], ["incidents.id"]),
        sa.PrimaryKeyConstraint("id"),
    )  # fmt: skip
    op.create_index("ix_changes_kind", "changes", ["kind"], unique=False)
    op.create_index("ix_changes_state", "changes", ["state"], unique=False)
    op.create_index("ix_changes_incident_id", "changes", ["incident_id"], unique=False)
    columns = ", ".join(f'"{c}"' for c in (*SHARED, *REMEDIATION))
    op.execute(
        f"INSERT INTO changes ({columns}, kind) SELECT {columns}, 'remediation' FROM remediations"
    )
    _move_tune_sessions()
    _repoint_canary_results("changes", "remediations")
    op.drop_table("remediations")  # its indexes go with it
    op.drop_table("tune_sessions")
    op.create_index(
        "uq_changes_holding_target", "changes", ["target"], unique=True,
        sqlite_where=sa.text(HOLDS), postgresql_where=sa.text(HOLDS),
    )  # fmt: skip
    _serial_past_max("changes")


def _move_tune_sessions() -> None:
    """Each tuning session into changes after the remediations, its renumbering audited."""
    bind = op.get_bind()
    first = bind.execute(sa.text("SELECT COALESCE(MAX(id), 0) FROM remediations")).scalar_one()
    sessions = bind.execute(sa.text("SELECT id, target, plan FROM tune_sessions ORDER BY id")).all()
    columns = ", ".join(f'"{c}"' for c in (*SHARED[1:], *TUNE))
    audit = sa.table("audit_log", sa.column("at", sa.DateTime(timezone=True)),
                     sa.column("incident_id", sa.Integer()), sa.column("actor", sa.String()),
                     sa.column("action", sa.String()), sa.column("detail", sa.JSON()),
                     sa.column("note", sa.Text()))  # fmt: skip
    now = dt.datetime.now(dt.UTC)
    for n, (old, target, plan) in enumerate(sessions, start=1):
        plan = plan if isinstance(plan, dict) else _loads(plan)
        kind = "drift_before_run" if "drift_before_run" in (plan or {}) else "tuning"
        new = first + n
        bind.execute(
            sa.text(
                f"INSERT INTO changes (id, kind, {columns}) SELECT :new, :kind, {columns} "
                "FROM tune_sessions WHERE id = :old"
            ),
            {"new": new, "kind": kind, "old": old},
        )
        if new != old:
            bind.execute(audit.insert().values(
                at=now, incident_id=None, actor="ruleloop", action="change.renumbered",
                detail={"tune_session": old, "change": new, "target": target, "kind": kind},
                note="migration 0015: tuning sessions moved into changes",
            ))  # fmt: skip


def _loads(text: object) -> dict[str, object]:
    return json.loads(text) if isinstance(text, str) else {}


def _repoint_canary_results(to: str, was: str) -> None:
    """canary_results.remediation_id references ``to`` (it referenced ``was``)."""
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint("canary_results_remediation_id_fkey", "canary_results", "foreignkey")
        op.create_foreign_key(
            "canary_results_remediation_id_fkey", "canary_results", to, ["remediation_id"], ["id"]
        )
        return
    # SQLite: the constraint has no name; a naming convention gives the reflected one a name
    naming = {"fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s"}
    with op.batch_alter_table("canary_results", naming_convention=naming) as batch:
        batch.drop_constraint(f"fk_canary_results_remediation_id_{was}", type_="foreignkey")
        batch.create_foreign_key(
            f"fk_canary_results_remediation_id_{to}", to, ["remediation_id"], ["id"]
        )


def _serial_past_max(*tables: str) -> None:
    """PostgreSQL: each table's id sequence continues past the ids the move wrote."""
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in tables:
        op.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
            f"COALESCE((SELECT MAX(id) FROM {table}), 0) + 1, false)"
        )


def downgrade() -> None:
    """Recreate remediations and tune_sessions as at 0014 and move the rows back by kind."""
    op.create_table(
        "remediations",
        *_shared_columns(),
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("adr_id", sa.String(length=32), nullable=False),
        sa.Column("approvals_needed", sa.Integer(), nullable=False),
        _json("change", False), _json("after", False),
        sa.Column("channel", sa.String(length=64), nullable=True),
        sa.Column("ts", sa.String(length=32), nullable=True),
        _json("silence", True),
        sa.ForeignKeyConstraint(["incident_id"], ["incidents.id"]),
        sa.PrimaryKeyConstraint("id"),
    )  # fmt: skip
    op.create_index("ix_remediations_incident_id", "remediations", ["incident_id"])
    op.create_index("ix_remediations_state", "remediations", ["state"])
    op.create_index(
        "uq_remediations_in_flight_target", "remediations", ["target"], unique=True,
        sqlite_where=sa.text(IN_FLIGHT), postgresql_where=sa.text(IN_FLIGHT),
    )  # fmt: skip
    op.create_table(
        "tune_sessions",
        *_shared_columns(),
        _json("plan", False), _json("trial", False),
        sa.PrimaryKeyConstraint("id"),
    )  # fmt: skip
    op.create_index("ix_tune_sessions_state", "tune_sessions", ["state"])
    op.create_index(
        "uq_tune_sessions_in_flight_target", "tune_sessions", ["target"], unique=True,
        sqlite_where=sa.text(TUNING), postgresql_where=sa.text(TUNING),
    )  # fmt: skip
    rem = ", ".join(f'"{c}"' for c in (*SHARED, *REMEDIATION))
    op.execute(
        f"INSERT INTO remediations ({rem}) SELECT {rem} FROM changes WHERE kind = 'remediation'"
    )
    tune = ", ".join(f'"{c}"' for c in (*SHARED, *TUNE))
    op.execute(
        f"INSERT INTO tune_sessions ({tune}) SELECT {tune} FROM changes "
        "WHERE kind IN ('tuning', 'drift_before_run')"
    )
    _repoint_canary_results("remediations", "changes")
    op.drop_table("changes")
    _serial_past_max("remediations", "tune_sessions")
