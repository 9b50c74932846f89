"""Snapshots keep their numbers in one JSON object by the catalogue's keys (migration 0014,
issue 32), on SQLite and a real PostgreSQL: a snapshot with ITL p99 goes through the store and
comes back as normal; a database holding snapshots in 0013's four columns upgrades with every
number kept (an unmeasured one stays unknown), and downgrades back into the columns."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from bot.diagnosis.normal import NormalReader
from bot.kernel.numbers.catalogue import NORMAL_KEYS
from bot.kernel.store import service as store
from bot.kernel.store.db import Database
from bot.kernel.store.models import UTCDateTime
from tests.test_bot_store import db, postgres  # noqa: F401  (store fixtures: SQLite and PostgreSQL)
from tests.test_migrations import empty  # noqa: F401  (an empty database on each backend)

AT = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
FIVE_MIN = dt.timedelta(minutes=5)
COLUMNS_0013 = ("ttft_p99_ms", "tpot_p99_ms", "goodput_ratio", "kv_fragmentation")
SNAPSHOTS_0013 = sa.table(
    "metric_snapshots",
    sa.column("id", sa.Integer()),
    sa.column("target", sa.String()),
    sa.column("at", UTCDateTime()),
    sa.column("source", sa.String()),
    sa.column("bounds", sa.JSON()),
    *(sa.column(name, sa.Double()) for name in COLUMNS_0013),
)
OLD_ROWS = [
    {"ttft_p99_ms": 40.0, "tpot_p99_ms": 10.0, "goodput_ratio": 0.97, "kv_fragmentation": 0.1,
     "bounds": {"tpot_p99_ms": "<="}},
    {"ttft_p99_ms": 44.0, "tpot_p99_ms": None, "goodput_ratio": None, "kv_fragmentation": 0.2,
     "bounds": None},
    {"ttft_p99_ms": 42.0, "tpot_p99_ms": 12.0, "goodput_ratio": 0.95, "kv_fragmentation": 0.3,
     "bounds": None},
]  # fmt: skip


async def test_a_snapshot_with_itl_goes_through_the_store_and_back_as_normal(
    db: Database,  # noqa: F811
) -> None:
    measured = {"ttft_p99_ms": 40.0, "tpot_p99_ms": 10.0, "kv_fragmentation": 0.1}
    for i, itl in enumerate([12.5, 20.0, 15.0]):
        with db.transaction() as s:
            store.add_snapshot(s, target="t", at=AT + i * FIVE_MIN, source="test",
                               numbers={**measured, "goodput_ratio": None, "itl_p99_ms": itl},
                               bounds={"itl_p99_ms": "<="} if i == 1 else None)  # fmt: skip
    with db.transaction() as s:
        (newest,) = store.recent_snapshots(s, target="t", limit=1)
        assert newest.numbers == {**measured, "itl_p99_ms": 15.0}  # goodput unknown: no key
    normal = await NormalReader(db=db, last=3).read("t")
    assert set(normal.numbers) == set(NORMAL_KEYS)
    assert normal.numbers["itl_p99_ms"] == 15.0 and normal.numbers["goodput_ratio"] is None
    assert normal.reading("itl_p99_ms").bound is None  # the bound was not the middle one


async def test_snapshots_in_0013s_columns_upgrade_into_numbers_and_downgrade_back(
    empty: Database,  # noqa: F811
) -> None:
    if empty.url.get_backend_name() == "sqlite":  # as create_schema does before migrating
        Path(str(empty.url.database)).parent.mkdir(parents=True)
    empty.migrate("0013")
    with empty.engine.begin() as connection:
        connection.execute(SNAPSHOTS_0013.insert(), [
            {"target": "t", "at": AT + i * FIVE_MIN, "source": "vllm_metrics 10s", **row}
            for i, row in enumerate(OLD_ROWS)
        ])  # fmt: skip
    empty.migrate("head")

    with empty.transaction() as s:
        kept = list(reversed(store.recent_snapshots(s, target="t", limit=10)))
        assert [x.numbers for x in kept] == [_measured(row) for row in OLD_ROWS]
        assert [x.bounds for x in kept] == [row["bounds"] for row in OLD_ROWS]
        store.add_snapshot(s, target="t", at=AT + 3 * FIVE_MIN, source="new",
                           numbers={"ttft_p99_ms": 50.0, "itl_p99_ms": 9.0})  # fmt: skip
    normal = await NormalReader(db=empty, last=3).read("t")
    assert normal.numbers["tpot_p99_ms"] == 12.0  # the one known in the newest 3
    assert normal.numbers["kv_fragmentation"] == pytest.approx(0.25)  # 0.2, 0.3 (new: none)

    with empty.engine.begin() as connection:
        command.downgrade(empty.alembic_config(connection), "0013")
        columns = [SNAPSHOTS_0013.c[name] for name in COLUMNS_0013]
        query = sa.select(SNAPSHOTS_0013.c.source, *columns).order_by(SNAPSHOTS_0013.c.at)
        back = [dict(row._mapping) for row in connection.execute(query)]
    # the four columns are back as they were; ITL p99 has no column at 0013 and is gone
    old = [{"source": "vllm_metrics 10s", **_columns(row)} for row in OLD_ROWS]
    new = {"source": "new", **_columns({"ttft_p99_ms": 50.0})}
    assert back == [*old, new]


def _measured(row: dict[str, Any]) -> dict[str, float]:
    return {k: row[k] for k in COLUMNS_0013 if row[k] is not None}


def _columns(row: dict[str, Any]) -> dict[str, float | None]:
    return {k: row.get(k) for k in COLUMNS_0013}
