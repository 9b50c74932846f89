"""alerts.started_at: an alert's startsAt as a time, parsed once at intake, so that nothing
reads the stored text back as a time (the diagnosis's chart places the alert with it).

Alerts stored before this revision keep NULL there: an incident opened before the upgrade and
diagnosed again after it shows its chart without the alert's mark.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the column (nullable: the alerts already stored have none)."""
    with op.batch_alter_table("alerts") as batch:
        batch.add_column(sa.Column("started_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    """Drop it (startsAt's text stays, as sent)."""
    with op.batch_alter_table("alerts") as batch:
        batch.drop_column("started_at")
