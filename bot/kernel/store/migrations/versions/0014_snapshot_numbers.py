"""metric_snapshots.numbers: a snapshot keeps its numbers in one JSON object keyed by the
catalogue's keys ({"ttft_p99_ms": 41.3, ...}; a key missing: not measured), so that a number
added to ``bot.kernel.numbers.catalogue`` needs no migration. The four fixed columns go.

The upgrade copies each row's four numbers into the object. The downgrade copies them back;
numbers that have no column at 0013 (ITL p99) are lost with the object.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The columns as revision 0013 left them: a migration describes the schema of its time, so
# these are spelled out here, not read from the catalogue (which grows).
COLUMNS = ("ttft_p99_ms", "tpot_p99_ms", "goodput_ratio", "kv_fragmentation")
_SNAPSHOTS = sa.table(
    "metric_snapshots",
    sa.column("id", sa.Integer()),
    sa.column("numbers", sa.JSON()),
    *(sa.column(name, sa.Double()) for name in COLUMNS),
)


def upgrade() -> None:
    """Add the object, fill it from the columns, then drop them."""
    with op.batch_alter_table("metric_snapshots") as batch:
        batch.add_column(sa.Column("numbers", sa.JSON(), nullable=True))
    bind = op.get_bind()
    rows = bind.execute(sa.select(_SNAPSHOTS.c.id, *(_SNAPSHOTS.c[n] for n in COLUMNS))).all()
    _update(bind, {"numbers": sa.bindparam("v_numbers", type_=sa.JSON())},
            [{"v_id": row.id, "v_numbers": _known(row)} for row in rows])  # fmt: skip
    with op.batch_alter_table("metric_snapshots") as batch:
        batch.alter_column("numbers", existing_type=sa.JSON(), nullable=False)
        for name in COLUMNS:
            batch.drop_column(name)


def downgrade() -> None:
    """Add the columns back, fill them from the object, then drop it."""
    with op.batch_alter_table("metric_snapshots") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.Double(), nullable=True))
    bind = op.get_bind()
    rows = bind.execute(sa.select(_SNAPSHOTS.c.id, _SNAPSHOTS.c.numbers)).all()
    values = {name: sa.bindparam(f"v_{name}", type_=sa.Double[float]()) for name in COLUMNS}
    _update(bind, values, [
        {"v_id": row.id, **{f"v_{n}": (row.numbers or {}).get(n) for n in COLUMNS}}
        for row in rows
    ])  # fmt: skip
    with op.batch_alter_table("metric_snapshots") as batch:
        batch.drop_column("numbers")


def _update(
    bind: sa.Connection, values: Mapping[str, sa.BindParameter[Any]], rows: list[dict[str, Any]]
) -> None:
    """One UPDATE per row, sent as one batch (none when the table is empty)."""
    if rows:
        where = _SNAPSHOTS.c.id == sa.bindparam("v_id")
        bind.execute(_SNAPSHOTS.update().where(where).values(values), rows)


def _known(row: sa.Row[tuple[object, ...]]) -> dict[str, float]:
    """The row's numbers that were measured. A non-finite one (which a float column holds but
    JSON does not) is left out: unknown, as a number not measured."""
    numbers = {name: getattr(row, name) for name in COLUMNS}
    return {k: float(v) for k, v in numbers.items() if v is not None and math.isfinite(v)}
