"""Tuning sessions: `ruleloop tune --target` records what served before it, so a restarted bot
restores it; at most one session in flight per target.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TUNING = "state IN ('running', 'restoring')"


def upgrade() -> None:
    """Create tune_sessions with its index of in-flight targets."""
    op.create_table(
        "tune_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("target", sa.String(length=200), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("requested_by", sa.String(length=64), nullable=False),
        sa.Column("approved_by", sa.JSON(), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("before", sa.JSON(), nullable=False),
        sa.Column("trial", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("runner", sa.String(length=200), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_tune_sessions_state", "tune_sessions", ["state"], unique=False)
    op.create_index(
        "uq_tune_sessions_in_flight_target",
        "tune_sessions",
        ["target"],
        unique=True,
        sqlite_where=sa.text(TUNING),
        postgresql_where=sa.text(TUNING),
    )


def downgrade() -> None:
    """Drop it (a session still running there loses its record: restore its target first)."""
    op.drop_index("uq_tune_sessions_in_flight_target", table_name="tune_sessions")
    op.drop_index("ix_tune_sessions_state", table_name="tune_sessions")
    op.drop_table("tune_sessions")
