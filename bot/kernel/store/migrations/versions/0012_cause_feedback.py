"""On-call's answers to the thread's "Cause confirmed" / "Wrong cause" buttons, one row each,
so `ruleloop adr stats` counts them and the next thread on the target can say a cause was
marked wrong.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create cause_feedback with its indexes (by incident; by target and cause)."""
    op.create_table(
        "cause_feedback",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("target", sa.String(length=200), nullable=False),
        sa.Column("cause", sa.String(length=64), nullable=False),
        sa.Column("verdict", sa.String(length=16), nullable=False),
        sa.Column("adr_ids", sa.JSON(), nullable=False),
        sa.Column("actor", sa.String(length=64), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["incident_id"], ["incidents.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_cause_feedback_incident_id", "cause_feedback", ["incident_id"], unique=False
    )
    op.create_index(
        "ix_cause_feedback_target_cause", "cause_feedback", ["target", "cause"], unique=False
    )


def downgrade() -> None:
    """Drop it (the answers are lost; the audit log keeps who pressed what)."""
    op.drop_index("ix_cause_feedback_target_cause", table_name="cause_feedback")
    op.drop_index("ix_cause_feedback_incident_id", table_name="cause_feedback")
    op.drop_table("cause_feedback")
