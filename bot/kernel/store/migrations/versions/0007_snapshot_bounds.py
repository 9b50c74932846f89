"""Snapshots keep which of their numbers are only bounds ('<=' 10 ms: the histogram's first bucket).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add metric_snapshots.bounds (null: every number known)."""
    op.add_column("metric_snapshots", sa.Column("bounds", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop metric_snapshots.bounds."""
    op.drop_column("metric_snapshots", "bounds")
