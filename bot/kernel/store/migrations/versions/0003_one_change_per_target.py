"""Remediations: at most one in flight (pending or running) per target.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

IN_FLIGHT = "state IN ('pending', 'approved', 'applying', 'canary', 'promoting', 'rolling_back')"


def upgrade() -> None:
    """Expire all but the newest pending request per target, then add the unique index."""
    # Before this revision a target could hold several requests; the older pending ones are
    # requests nobody approved yet, so they end as the approval sweep would end them.
    op.execute(
        sa.text(
            "UPDATE remediations SET state = 'expired' WHERE state = 'pending' AND EXISTS ("
            "SELECT 1 FROM remediations AS newer WHERE newer.target = remediations.target "
            f"AND newer.id > remediations.id AND newer.{IN_FLIGHT})"
        )
    )
    running = (
        op.get_bind()
        .execute(
            sa.text(
                f"SELECT target FROM remediations WHERE {IN_FLIGHT} GROUP BY target "
                "HAVING COUNT(*) > 1"
            )  # fmt: skip
        )
        .scalars()
        .all()
    )
    if running:
        raise RuntimeError(
            f"targets {sorted(running)} have more than one change running: let them finish "
            "(or roll them back by hand and mark them failed) before upgrading"
        )
    with op.batch_alter_table("remediations", schema=None) as batch_op:
        batch_op.create_index(
            "uq_remediations_in_flight_target",
            ["target"],
            unique=True,
            sqlite_where=sa.text(IN_FLIGHT),
            postgresql_where=sa.text(IN_FLIGHT),
        )


def downgrade() -> None:
    """Drop the index."""
    with op.batch_alter_table("remediations", schema=None) as batch_op:
        batch_op.drop_index("uq_remediations_in_flight_target")
