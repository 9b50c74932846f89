"""Liveness and readiness of `ruleloop serve`, on the real ASGI app and a real PostgreSQL that
goes away: /livez asks nothing but the process, /readyz asks the store, /healthz stays what it
was (the store), and the Deployment's probes use the first two, so that a database blip takes
the replicas out of the Service instead of restarting them. /metrics keeps answering too (the
bot-down alert reads its scrape), with ruleloop_store_up 0."""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.fakes.alerts import alert, body
from tests.fakes.bot import harness
from tests.fakes.slack_api import FakeSlack
from tests.kustomize_render import EXAMPLE, by_kind, kustomize

pytestmark = pytest.mark.faults

PG_BIN = max(Path("/usr/lib/postgresql").glob("*/bin"), default=Path("/nonexistent"))


class Postgres:
    """A throwaway PostgreSQL server that a test can stop and start again (a blip)."""

    def __init__(self) -> None:
        import pwd

        self.root = Path(tempfile.mkdtemp(prefix="ruleloop-pg-"))
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # initdb refuses to run as root
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.data = self.root / "data"
        self._run = functools.partial(subprocess.run, check=True, capture_output=True, timeout=120)
        self._run([*self.as_user, str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust",
                   "-U", "postgres"])  # fmt: skip
        self.start()
        admin = create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text("CREATE DATABASE ruleloop"))
        admin.dispose()

    def url(self, database: str = "ruleloop") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _ctl(self, *argv: str) -> None:
        self._run([*self.as_user, str(PG_BIN / "pg_ctl"), "-D", str(self.data), *argv])

    def start(self) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
        self._ctl("-o", options, "-l", str(self.root / "log"), "-w", "start")

    def stop(self) -> None:
        self._ctl("-m", "immediate", "-w", "stop")

    def remove(self) -> None:
        subprocess.run([*self.as_user, str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m",
                        "immediate", "stop"], capture_output=True, timeout=120)  # fmt: skip
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def postgres() -> Iterator[Postgres]:
    if not (PG_BIN / "initdb").exists():
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    server = Postgres()
    try:
        yield server
    finally:
        server.remove()


def probes() -> dict[str, str]:
    """The paths of the rendered Deployment's probes (the example overlay)."""
    (deployment,) = by_kind(kustomize(EXAMPLE), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {probe: container[probe]["httpGet"]["path"] for probe in ("livenessProbe", "readinessProbe")}  # fmt: skip


async def test_a_postgres_blip_fails_readiness_never_liveness(
    tmp_path: Path, slack: FakeSlack, postgres: Postgres
) -> None:
    h = harness(tmp_path, slack=slack, store={"url": postgres.url()})
    try:
        paths = probes()
        assert paths == {"livenessProbe": "/livez", "readinessProbe": "/readyz"}
        for path in (*paths.values(), "/healthz"):
            assert (await h.client.get(path)).status_code == 200, path
        postgres.stop()  # the blip
        live = await h.client.get(paths["livenessProbe"])
        assert (live.status_code, live.json()) == (200, {"status": "ok"})
        ready = await h.client.get(paths["readinessProbe"])
        assert ready.status_code == 503 and "store" in ready.json()["error"]
        assert (await h.client.get("/healthz")).status_code == 503  # as before, for compatibility
        scraped = await h.client.get("/metrics")
        assert scraped.status_code == 200 and "ruleloop_store_up 0.0" in scraped.text
        postgres.start()  # back: ready again, nothing restarted
        assert (await h.client.get(paths["readinessProbe"])).status_code == 200
        assert "ruleloop_store_up 1.0" in (await h.client.get("/metrics")).text
        assert (await h.webhook(body(alert()))).status_code == 202
    finally:
        await h.close()


async def test_a_slack_outage_keeps_the_bot_ready_and_shows_what_is_owed(
    tmp_path: Path, slack: FakeSlack
) -> None:
    """Webhooks are still taken while Slack is down (the outbox holds the messages)."""
    h = harness(tmp_path, slack=slack)
    try:
        slack.outage("5xx")
        assert (await h.webhook(body(alert()))).status_code == 202
        await h.bot.tasks.drain()
        ready = await h.client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["transport"] == "slack"
        assert ready.json()["slack_messages"]["pending"] >= 1
        assert (await h.client.get("/healthz")).json() == ready.json()
        scraped = (await h.client.get("/metrics")).text
        assert 'ruleloop_outbox_messages{state="pending"}' in scraped
        assert 'ruleloop_outbox_messages{state="pending"} 0.0' not in scraped
        assert "ruleloop_store_up 1.0" in scraped
    finally:
        await h.close()


async def test_a_failed_rollback_is_counted_from_the_audit_log(
    tmp_path: Path, slack: FakeSlack
) -> None:
    import datetime as dt

    from bot.kernel.store.models import AuditEntry
    from bot.kernel.store.readings import ROLLBACK_FAILED

    h = harness(tmp_path, slack=slack)
    try:
        scraped = (await h.client.get("/metrics")).text
        assert "ruleloop_remediation_rollbacks_failed_total 0.0" in scraped
        assert "ruleloop_outbox_oldest_pending_seconds 0.0" in scraped
        with h.bot.db.transaction() as s:  # what RemediationService writes when it happens
            s.add(AuditEntry(at=dt.datetime.now(dt.UTC), actor="ruleloop",
                             action=ROLLBACK_FAILED, detail={"error": "x"}))  # fmt: skip
        scraped = (await h.client.get("/metrics")).text
        assert "ruleloop_remediation_rollbacks_failed_total 1.0" in scraped
    finally:
        await h.close()
