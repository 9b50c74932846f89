"""A big alert group through a real Alertmanager (0.25) running the shipped config
(deploy/alertmanager/alertmanager.yml): 1,500 kube-prometheus-sized alerts of one group reach
the bot as one notification under ``[server] max_body_bytes`` (``max_alerts`` caps it; the rest
is counted in ``truncatedAlerts``), and that notification opens an incident."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml

from bot.engine.process import free_port
from bot.kernel.config import ServerSettings
from tests import store_reads
from tests.alertmanager_process import alertmanager as running_alertmanager
from tests.alertmanager_process import kube_alert, wait
from tests.fakes.bot import AM_TOKEN, Harness, harness

pytestmark = pytest.mark.faults

CONFIG = Path(__file__).parent.parent / "deploy" / "alertmanager" / "alertmanager.yml"
ALERTS = 1500


class Received(BaseHTTPRequestHandler):
    """The bot's address, as Alertmanager sees it: records each notification's body."""

    bodies: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        length = int(self.headers.get("Content-Length", 0))
        assert self.headers.get("Authorization") == f"Bearer {AM_TOKEN}"
        self.bodies.append(self.rfile.read(length))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[int, list[bytes]]]:
    bodies: list[bytes] = []
    handler = type("Handler", (Received,), {"bodies": bodies})
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], bodies
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def alertmanager(tmp_path: Path, receiver: tuple[int, list[bytes]]) -> Iterator[str]:
    """The shipped config, pointed at ``receiver`` and with the test's short group timers."""
    config = yaml.safe_load(CONFIG.read_text())
    config["route"].update(group_wait="1s", group_interval="1m")
    (tmp_path / "token").write_text(AM_TOKEN)
    for receiver_ in config["receivers"]:
        for hook in receiver_.get("webhook_configs", []):
            hook["url"] = f"http://127.0.0.1:{receiver[0]}/alertmanager"
            hook["http_config"]["authorization"]["credentials_file"] = str(tmp_path / "token")
    with running_alertmanager(tmp_path, config) as url:
        yield url


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    harness_ = harness(tmp_path, slack=None)
    yield harness_
    await harness_.close()


async def test_a_group_of_1500_alerts_reaches_the_bot_as_one_notification_that_fits(
    tmp_path: Path, alertmanager: str, receiver: tuple[int, list[bytes]], h: Harness
) -> None:
    """Issue 31 item 4: the whole group (1,500 x ~930 bytes) was 1.4 MB, over the 1 MiB cap:
    413 on every repeat, never an incident."""
    sent = [kube_alert(n) for n in range(ALERTS)]
    assert httpx.post(f"{alertmanager}/api/v2/alerts", json=sent, timeout=30).status_code == 200
    bodies = receiver[1]
    wait(lambda: bodies, what="the notification", log=tmp_path / "am.log")
    time.sleep(1)  # nothing else of this group is due for group_interval (1 m)
    assert len(bodies) == 1
    notification = json.loads(bodies[0])
    capped = len(notification["alerts"])
    assert 0 < capped < ALERTS and notification["truncatedAlerts"] == ALERTS - capped
    assert len(bodies[0]) <= ServerSettings().max_body_bytes // 2, (len(bodies[0]), capped)
    answered = await h.webhook(bodies[0])
    assert answered.status_code == 202, answered.text
    with h.bot.db.transaction() as s:
        [incident] = store_reads.incidents(s)
        assert len(incident.alerts) == capped
