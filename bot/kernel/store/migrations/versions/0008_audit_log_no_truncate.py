"""The audit log refuses TRUNCATE on PostgreSQL too (its row triggers never fire for it).

0001's triggers refuse UPDATE and DELETE of an audit entry, row by row; ``TRUNCATE audit_log``
fires no row trigger and emptied the append-only log. A statement-level trigger refuses it.
SQLite has no TRUNCATE: its ``DELETE FROM audit_log`` meets 0001's row trigger (SQLite's
truncate optimisation is off for a table with triggers).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The same refusal as 0001's, for the whole statement.
PG_GUARD = (
    """
CREATE FUNCTION audit_log_no_truncate() RETURNS trigger AS $$
BEGIN RAISE EXCEPTION 'audit_log is append-only'; END $$ LANGUAGE plpgsql
""",
    """
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
FOR EACH STATEMENT EXECUTE FUNCTION audit_log_no_truncate()
""",
)


def upgrade() -> None:
    """Add the statement-level TRUNCATE guard on PostgreSQL."""
    if op.get_bind().dialect.name == "postgresql":
        for statement in PG_GUARD:
            op.execute(statement)


def downgrade() -> None:
    """Drop it."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_truncate ON audit_log")
        op.execute("DROP FUNCTION IF EXISTS audit_log_no_truncate()")
