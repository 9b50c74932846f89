"""Slack replay guard in the store: signed requests already received, shared by replicas.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create slack_replays (a unique key per signed request, and when it may be forgotten)."""
    op.create_table(
        "slack_replays",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key"),
    )
    op.create_index("ix_slack_replays_expires_at", "slack_replays", ["expires_at"], unique=False)


def downgrade() -> None:
    """Drop slack_replays."""
    op.drop_index("ix_slack_replays_expires_at", table_name="slack_replays")
    op.drop_table("slack_replays")
