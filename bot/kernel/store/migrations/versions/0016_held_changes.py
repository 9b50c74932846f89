"""changes: a remediation may be ``held``: its canary could not decide, the ADR asked for a human
to keep or roll back the change, and until one does (or the hold expires) it still holds its
target. The partial unique index on the changes that hold a target gains the state.

The downgrade hands each held change to the older bot as ``rolling_back`` (with its heartbeat
left stale, its resume rolls it back to the recorded flags: the safe end of a hold).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The states as each revision has them (spelled out: a migration describes its own time).
HOLDS_0015 = (
    "state IN ('pending', 'approved', 'applying', 'canary', 'promoting', 'rolling_back', "
    "'running', 'restoring')"
)
HOLDS_0016 = (
    "state IN ('pending', 'approved', 'applying', 'canary', 'promoting', 'rolling_back', "
    "'held', 'running', 'restoring')"
)
INDEX = "uq_changes_holding_target"


def _holding_index(where: str) -> None:
    op.drop_index(INDEX, table_name="changes")
    op.create_index(
        INDEX, "changes", ["target"], unique=True,
        sqlite_where=sa.text(where), postgresql_where=sa.text(where),
    )  # fmt: skip


def upgrade() -> None:
    _holding_index(HOLDS_0016)


def downgrade() -> None:
    op.execute("UPDATE changes SET state = 'rolling_back' WHERE state = 'held'")
    _holding_index(HOLDS_0015)
