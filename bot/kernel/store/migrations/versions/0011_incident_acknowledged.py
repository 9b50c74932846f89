"""Incidents keep who acknowledged them from the thread's Acknowledge button (and when), so the
root message can show it on every re-render.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add incidents.acknowledged_by (a Slack user ID) and incidents.acknowledged_at."""
    op.add_column("incidents", sa.Column("acknowledged_by", sa.String(length=64), nullable=True))
    op.add_column(
        "incidents", sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    """Drop them."""
    op.drop_column("incidents", "acknowledged_at")
    op.drop_column("incidents", "acknowledged_by")
