"""Alembic's environment: migrate the connection ``bot.kernel.store.db`` hands over, never a URL.

``Database.upgrade`` opens the transaction (and on PostgreSQL takes the migration lock) and puts
its connection in ``config.attributes["connection"]``; everything here runs inside it.
"""

from __future__ import annotations

from alembic import context

from bot.kernel.store.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "run migrations through bot.kernel.store.db.Database (or `ruleloop db upgrade`)"
    )
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
