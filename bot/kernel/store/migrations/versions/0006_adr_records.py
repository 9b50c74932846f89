"""ADR records in the store: drafts, reviews and accepted records, shared by every replica.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create adr_records (one row per ADR id) and adr_revisions (each version it had)."""
    op.create_table(
        "adr_records",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("adr_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("draft", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("sha", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("synced_sha", sa.String(length=64), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("updated_by", sa.String(length=200), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("adr_id"),
    )
    op.create_index("ix_adr_records_status", "adr_records", ["status"], unique=False)
    op.create_table(
        "adr_revisions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("adr_id", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("sha", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("adr_id", "version", name="uq_adr_revision"),
    )
    op.create_index("ix_adr_revisions_adr_id", "adr_revisions", ["adr_id"], unique=False)


def downgrade() -> None:
    """Drop them (the ADR directory and `ruleloop adr export` keep the records as files)."""
    op.drop_index("ix_adr_revisions_adr_id", table_name="adr_revisions")
    op.drop_table("adr_revisions")
    op.drop_index("ix_adr_records_status", table_name="adr_records")
    op.drop_table("adr_records")
