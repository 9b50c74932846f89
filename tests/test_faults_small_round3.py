"""Small faults of the third review (docs/reliability.md): the agent's `max_processes=²`, an
exported record name with `../`, `TRUNCATE audit_log` on PostgreSQL, placeholder webhook
tokens, and `--insecure-no-auth` on an address others can reach.

The real parts: the agent's Starlette app over ASGI (the fake NVML underneath), the CLI with a
real SQLite and PostgreSQL store, the store migrated by its Alembic migrations."""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import select, text
from sqlalchemy.exc import DatabaseError

from bot.adr.shared import SharedAdrStore
from bot.agent.app import create_app
from bot.agent.session import NvmlSession
from bot.app.cli import agent as agent_cli
from bot.app.cli import cli
from bot.kernel.config import Settings
from bot.kernel.errors import UsageError
from bot.kernel.store import service as store
from bot.kernel.store.db import Database
from bot.kernel.store.models import AdrRecord
from tests import store_reads
from tests.conftest import FIXTURES
from tests.fakes.nvml import FakeNvml
from tests.fakes.nvml_agent import TOKEN
from tests.test_bot_store import new_database, postgres  # noqa: F401  (the real PostgreSQL server fixture)

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[1]
T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


# --- the agent's max_processes -----------------------------------------------------------------
@pytest.mark.parametrize("raw", ["²", "١٢", "-1", "101", "", "3.0", "+3", " 3"])
async def test_a_max_processes_that_is_not_ascii_digits_is_a_400_not_a_500(raw: str) -> None:
    """`²` passed str.isdigit() and then failed int(): a 500."""
    session = NvmlSession(FakeNvml.from_file(FIXTURES / "nvml" / "h200-x2.json"), hostname="h")
    app = create_app(session, token=TOKEN)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://agent"
        ) as client:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            bad = await client.get("/snapshot", params={"max_processes": raw}, headers=headers)
            assert bad.status_code == 400, bad.text
            assert "max_processes must be a whole number" in bad.json()["error"]["message"]
            good = await client.get("/snapshot", params={"max_processes": "2"}, headers=headers)
            assert good.status_code == 200
    finally:
        session.close()


# --- adr export ---------------------------------------------------------------------------------
@pytest.fixture
def pg_url(postgres: str) -> Iterator[str]:  # noqa: F811
    """A new, empty database on the real PostgreSQL server."""
    yield new_database(postgres, prefix="s")


@pytest.mark.parametrize(
    "name",
    [
        "../../escaped.md",
        "ADR-20260831-01-../../../escaped.md",
        "{tmp}/escaped.md",
        "..",
        "a\\b.md",
    ],
)
def test_adr_export_refuses_a_stored_name_that_is_not_a_file_name(
    tmp_path: Path, name: str
) -> None:
    """The record's name was joined to DIR as stored: `../` wrote outside it."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    db = Database(url)
    db.create_schema()
    try:
        source = tmp_path / "adr"
        shutil.copytree(ROOT / "adr", source)
        SharedAdrStore(root=source, db=db, clock=lambda: T0).sync()  # the files, imported
        with db.transaction() as s:
            record = s.scalars(select(AdrRecord).order_by(AdrRecord.id)).first()
            assert record is not None
            record.name, adr_id = name.format(tmp=tmp_path), record.adr_id
        out = tmp_path / "deep" / "er" / "adr"
        before = sorted(p for p in tmp_path.rglob("*") if p.is_file())
        env = {"RULELOOP_CONFIG": None, "RULELOOP_DATABASE_URL": url, "RULELOOP_ADR_DIR": None}
        result = CliRunner().invoke(cli, ["adr", "export", str(out)], env=env)
        assert result.exit_code == 2, result.output
        assert "not a file name" in result.output and "Traceback" not in result.output
        assert adr_id in result.output
        after = sorted(p for p in tmp_path.rglob("*") if p.is_file())
        assert [p for p in after if p not in before] == []  # nothing written, inside or out
    finally:
        db.dispose()


# --- the audit log on PostgreSQL ----------------------------------------------------------------
def test_the_audit_log_cannot_be_truncated_on_postgresql(pg_url: str) -> None:
    """UPDATE and DELETE were refused by a row trigger; TRUNCATE fires no row trigger."""
    db = Database(pg_url)
    db.create_schema()
    try:
        with db.transaction() as s:
            store.audit(s, at=T0, actor="t", action="test.entry", detail={})
        with pytest.raises(DatabaseError, match="append-only"), db.engine.begin() as connection:
            connection.execute(text("TRUNCATE audit_log"))
        with pytest.raises(DatabaseError, match="append-only"), db.engine.begin() as connection:
            connection.execute(text("TRUNCATE audit_log CASCADE"))
        with pytest.raises(DatabaseError, match="append-only"), db.engine.begin() as connection:
            connection.execute(text("TRUNCATE incidents CASCADE"))  # reaches audit_log too
        with db.transaction() as s:
            assert [e.action for e in store_reads.audit_trail(s)] == ["test.entry"]
    finally:
        db.dispose()


# --- the Alertmanager token --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("replace-me", "is a placeholder"),
        ("changeme-changeme", "is a placeholder"),
        ("abc123", "is 6 characters; use at least 16"),
        ("x" * 15, "is 15 characters; use at least 16"),
    ],
)
def test_a_placeholder_or_short_webhook_token_is_refused(token: str, message: str) -> None:
    """`replace-me` (the example Secret's value) was accepted: anyone could post alerts."""
    with pytest.raises(UsageError) as refused:
        Settings.load({"RULELOOP_ALERTMANAGER_TOKEN": token, "RULELOOP_CONFIG": ""})
    said = str(refused.value)
    assert "alertmanager.token" in said and message in said
    assert "openssl rand -hex 32" in said
    assert token not in said  # a secret is never echoed back
    assert Settings.load({"RULELOOP_ALERTMANAGER_TOKEN": "a" * 8 + "-" + "b" * 16}).alertmanager


def test_the_placeholder_of_the_shipped_secret_example_is_refused() -> None:
    example = (ROOT / "deploy" / "kubernetes" / "base" / "secret.example.yaml").read_text()
    line = next(x for x in example.splitlines() if "RULELOOP_ALERTMANAGER_TOKEN:" in x)
    placeholder = line.split(":", 1)[1].strip()
    with pytest.raises(UsageError, match="is a placeholder"):
        Settings.load({"RULELOOP_ALERTMANAGER_TOKEN": placeholder})


# --- --insecure-no-auth -------------------------------------------------------------------------
@pytest.mark.parametrize("listen", ["0.0.0.0:9401", "10.0.0.5:9401", "[::]:9401", "gpu-7:9401"])
def test_insecure_no_auth_is_refused_off_loopback(
    listen: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It served /snapshot without a token on 0.0.0.0 (every network of the node)."""
    served: list[object] = []

    async def serve(*args: object) -> None:  # what it would serve, instead of serving it
        served.append(args)

    monkeypatch.setattr(agent_cli, "_serve", serve)
    result = CliRunner().invoke(
        cli,
        ["agent", "--listen", listen, "--insecure-no-auth", "--no-watch-xid"],
        env={"RULELOOP_AGENT_TOKEN": ""},
    )
    assert served == [] and result.exit_code == 2, result.output
    assert "--insecure-no-auth is only allowed on a loopback address" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_insecure_no_auth_is_allowed_on_loopback(host: str) -> None:
    agent_cli.refuse_insecure_off_loopback(host)  # no UsageError
