"""Remediations: the run working on each (runner) and its heartbeat on the database's clock.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add runner and heartbeat_at; a change in flight keeps its last sign of life."""
    with op.batch_alter_table("remediations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("runner", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(sa.text("UPDATE remediations SET heartbeat_at = updated_at"))


def downgrade() -> None:
    """Drop them."""
    with op.batch_alter_table("remediations", schema=None) as batch_op:
        batch_op.drop_column("heartbeat_at")
        batch_op.drop_column("runner")
