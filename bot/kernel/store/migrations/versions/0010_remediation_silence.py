"""Remediations keep the Alertmanager silence of their change, so a silence left by a run that
died is expired by the replica that resumes it.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add remediations.silence (JSON, NULL: none)."""
    op.add_column("remediations", sa.Column("silence", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop remediations.silence."""
    op.drop_column("remediations", "silence")
