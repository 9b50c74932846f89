"""The database's clock, for times that replicas compare with each other (heartbeats).

Each replica's own clock is fine for what it alone reads back, but a heartbeat written by one
replica and judged stale by another must be on one clock: the database's. ``db_now()`` and
``db_ago(seconds)`` are SQL expressions evaluated by the server, for UPDATE values and WHERE
clauses. On SQLite they are written in the format SQLAlchemy stores datetimes in (six digits
of fraction), so they compare as strings with stored values.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Float, literal
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from bot.kernel.store.models import UTCDateTime


class db_now(FunctionElement[dt.datetime]):  # noqa: N801 (an SQL function, named as one)
    """The database server's current time."""

    type = UTCDateTime()
    inherit_cache = True
    name = "db_now"


class db_ago(FunctionElement[dt.datetime]):  # noqa: N801
    """The database server's current time minus ``seconds``."""

    type = UTCDateTime()
    inherit_cache = True
    name = "db_ago"

    def __init__(self, seconds: float) -> None:
        super().__init__(literal(float(seconds), Float()))


_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now'{modifier}) || '000'"


@compiles(db_now, "sqlite")
def _now_sqlite(element: db_now, compiler: Any, **kw: Any) -> str:
    return "(" + _SQLITE_NOW.format(modifier="") + ")"


@compiles(db_ago, "sqlite")
def _ago_sqlite(element: db_ago, compiler: Any, **kw: Any) -> str:
    seconds = compiler.process(element.clauses, **kw)
    return "(" + _SQLITE_NOW.format(modifier=f", '-' || {seconds} || ' seconds'") + ")"


@compiles(db_now)
def _now_default(element: db_now, compiler: Any, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP"


@compiles(db_ago)
def _ago_default(element: db_ago, compiler: Any, **kw: Any) -> str:
    seconds = compiler.process(element.clauses, **kw)
    return f"(CURRENT_TIMESTAMP - make_interval(secs => {seconds}))"
