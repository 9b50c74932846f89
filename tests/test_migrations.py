"""Schema migrations (Alembic) on SQLite and a real PostgreSQL: the models and the migrated schema
agree, replicas starting at once migrate safely, and the package ships its migrations."""

from __future__ import annotations

import shutil
import sqlite3
import time
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from click.testing import CliRunner
from sqlalchemy import inspect

from bot.app.cli import cli
from bot.kernel.store.db import MIGRATIONS, Database
from bot.kernel.store.models import Base
from tests.test_bot_store import new_database, postgres  # noqa: F401  (the real PostgreSQL server fixture)

ROOT = Path(__file__).parent.parent


def new_url(request: pytest.FixtureRequest, tmp_path: Path, backend: str) -> str:
    """The URL of a new, empty database on ``backend``."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'state' / 'ruleloop.db'}"
    server = request.getfixturevalue("postgres")
    return new_database(server, prefix="m")


@pytest.fixture(params=["sqlite", "postgresql"])
def empty(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A new database with no schema yet, on each backend."""
    database = Database(new_url(request, tmp_path, request.param))
    yield database
    database.dispose()


def head() -> str:
    """The newest revision of the shipped migrations."""
    heads = ScriptDirectory(str(MIGRATIONS)).get_heads()
    assert len(heads) == 1, f"the migrations branch: heads {heads}"
    return heads[0]


def test_migrations_match_the_models(empty: Database) -> None:
    empty.create_schema()
    with empty.engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == [], (
        "the models and the migrations disagree: add a revision under bot/kernel/store/migrations/"
        f"versions (`ruleloop db revision -m '...'` writes one from the models): {diff}"
    )
    assert empty.revision() == head()


def test_migrations_upgrade_is_idempotent_and_downgrades(empty: Database) -> None:
    empty.create_schema()
    empty.create_schema()
    assert empty.revision() == head()
    with empty.engine.begin() as connection:
        command.downgrade(empty.alembic_config(connection), "base")
    assert set(inspect(empty.engine).get_table_names()) <= {"alembic_version"}
    empty.create_schema()
    assert set(Base.metadata.tables) <= set(inspect(empty.engine).get_table_names())


def test_migrations_replicas_starting_at_once(empty: Database) -> None:
    """Four replicas (own engines) upgrade one empty database at the same moment: none fails."""
    replicas = [Database(str(empty.url.render_as_string(hide_password=False))) for _ in range(4)]
    try:
        with ThreadPoolExecutor(len(replicas)) as pool:
            list(pool.map(lambda db: db.create_schema(), replicas))
        assert {db.revision() for db in replicas} == {head()}
    finally:
        for db in replicas:
            db.dispose()


def test_a_new_sqlite_file_waits_for_a_writer_before_turning_on_wal(tmp_path: Path) -> None:
    """SQLite refuses a journal-mode change at once while another connection writes (no busy
    wait): replicas creating one new file together lost that race. The second one must wait."""
    path = tmp_path / "ruleloop.db"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("CREATE TABLE first_replica (x)")  # rollback-journal mode, write lock held
    replica = Database(f"sqlite:///{path}")
    try:
        with ThreadPoolExecutor(1) as pool:
            upgrade = pool.submit(replica.create_schema)
            time.sleep(0.5)  # the replica is now waiting on the writer, not failed
            assert not upgrade.done(), upgrade.exception()
            writer.execute("COMMIT")
            upgrade.result(timeout=60)
        assert replica.revision() == head()
        with sqlite3.connect(path) as reader:
            assert reader.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        writer.close()
        replica.dispose()


def test_migrations_ship_with_the_package() -> None:
    versions = MIGRATIONS / "versions"
    assert (MIGRATIONS / "__init__.py").exists() and (versions / "__init__.py").exists()
    assert (MIGRATIONS / "env.py").exists() and any(versions.glob("0001_*.py"))
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "kernel/store/migrations/script.py.mako" in config["tool"]["setuptools"]["package-data"]["bot"]


def test_db_cli_upgrades_and_reports_the_revision(tmp_path: Path) -> None:
    def run(*args: str) -> tuple[int, str]:
        env: dict[str, str | None] = {"RULELOOP_CONFIG": None, "RULELOOP_DATABASE_URL": None}
        result = CliRunner().invoke(cli, ["db", *args, "--state-dir", str(tmp_path)], env=env)
        return result.exit_code, result.output

    where = f"sqlite:///{tmp_path / 'ruleloop.db'}"
    assert run("current") == (
        0,
        f"{where}: revision none, newest {head()} (needs `ruleloop db upgrade`)\n",
    )
    assert run("upgrade") == (0, f"{where}: upgraded from an empty database to {head()}\n")
    assert run("upgrade") == (0, f"{where}: already at revision {head()}\n")
    assert run("current") == (0, f"{where}: revision {head()}, newest {head()} (up to date)\n")
    result = CliRunner().invoke(
        cli,
        ["db", "current"],
        env={"RULELOOP_DATABASE_URL": "postgresql+psycopg://x@127.0.0.1:1/y"},
    )
    assert result.exit_code == 2 and "cannot open the incident store" in result.output


def test_db_cli_revision_writes_a_migration_from_the_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr("bot.kernel.store.db.MIGRATIONS", copy)
    result = CliRunner().invoke(cli, ["db", "revision", "-m", "nothing changed"])
    assert result.exit_code == 0, result.output
    (written,) = [
        p
        for p in (copy / "versions").glob("*.py")
        if not (MIGRATIONS / "versions" / p.name).exists()
    ]
    source = written.read_text()
    assert f"down_revision: str | None = {head()!r}" in source and "pass" in source
