"""Outbox: what the bot owes each incident in Slack, kept until it lands (or is refused).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create outbox (one row per message or diagnosis owed, claimed by one replica at a time)."""
    op.create_table(
        "outbox",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("key", sa.String(length=32), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_by", sa.String(length=200), nullable=True),
        sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("channel", sa.String(length=64), nullable=True),
        sa.Column("ts", sa.String(length=32), nullable=True),
        sa.ForeignKeyConstraint(["incident_id"], ["incidents.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("incident_id", "key", name="uq_outbox_incident_key"),
    )
    op.create_index("ix_outbox_incident_id", "outbox", ["incident_id"], unique=False)
    op.create_index("ix_outbox_state_next_at", "outbox", ["state", "next_at"], unique=False)


def downgrade() -> None:
    """Drop outbox."""
    op.drop_index("ix_outbox_state_next_at", table_name="outbox")
    op.drop_index("ix_outbox_incident_id", table_name="outbox")
    op.drop_table("outbox")
