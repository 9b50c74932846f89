"""Fuzz: alert groups of generated sizes (1 to 1,500 kube-prometheus-sized alerts, around the
shipped ``max_alerts: 500`` and the 1 MiB ``[server] max_body_bytes``) go through a REAL
Alertmanager running the shipped route config (deploy/alertmanager/alertmanager.yml) straight to
a real `ruleloop serve` process: every group becomes one incident holding the alerts its
notification carried, none is lost, no notification fails, and /readyz, polled throughout,
never fails.

The bot keys an incident by its target, else by Alertmanager's group key
(bot/incidents/intake/service.py); each generated group has its own `instance` (the shipped config groups
by instance), either one of the configured targets' engines (keyed by target) or an unknown
one (keyed by group). The targets' engines are loopback addresses nobody listens on, so each
incident's diagnosis reports its probes failing; the incident exists all the same.

Fails when a notification does not fit the body cap (tried with ``max_body_bytes`` lowered to
300,000 bytes: the groups capped at 500 alerts, about 470 KB, get 413 and never become
incidents) or when the route's ``max_alerts`` is removed (tried: groups of 501 and 1,128 came
whole; a larger group is over 1 MiB, refused with 413 on every repeat, row 54).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from bot.engine.process import free_port
from bot.kernel.store.db import Database
from tests import store_reads
from tests.alertmanager_process import alertmanager as running_alertmanager
from tests.alertmanager_process import kube_alert
from tests.fakes.bot import AM_TOKEN
from tests.test_bot_e2e import Process

pytestmark = [pytest.mark.slow, pytest.mark.faults]

CONFIG = Path(__file__).parent.parent / "deploy" / "alertmanager" / "alertmanager.yml"
MAX_ALERTS = 500  # the shipped webhook's max_alerts (read back from CONFIG below)
TARGETS = 120  # configured targets t000..: more than the examples' groups together
# sizes around the cap: one alert, max_alerts and its neighbours, about 1 MiB, the most
SIZES = st.sampled_from([1, 2, 499, 500, 501, 1127, 1128, 1500]) | st.integers(1, 1500)
GROUP = st.tuples(SIZES, st.booleans())  # (alerts, whether its instance is a target's engine)
WAIT_S = 90  # a bound on waiting for a notification on a loaded machine, not a timing check


def engine_of(n: int) -> str:
    """Target n's engine: a loopback address with nothing listening (probes are refused)."""
    return f"127.0.{1 + n // 250}.{1 + n % 250}:9"


@dataclass
class Readiness:
    """/readyz asked every 0.2 s from a thread while the module runs; each failure kept."""

    url: str
    polls: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.wait(0.2):
                try:
                    answer = client.get(f"{self.url}/readyz")
                    if answer.status_code != 200:
                        self.failures.append(f"{answer.status_code} {answer.text[:200]}")
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                self.polls += 1


@dataclass
class Stack:
    bot: str
    am: str
    db: Database
    log: Path
    readiness: Readiness
    free_targets: Iterator[int] = field(default_factory=itertools.count)
    unknown: Iterator[int] = field(default_factory=itertools.count)


def bot_config(tmp_path: Path) -> Path:
    """ruleloop.toml: TARGETS targets (dry-run actuators), no Slack (console transport)."""
    lines = ['[slack]\nchannel = "#incidents"\n']
    for n in range(TARGETS):
        lines.append(f'[targets.t{n:03d}]\nvllm_url = "http://{engine_of(n)}"\n')
        lines.append(f'[targets.t{n:03d}.actuator]\nkind = "dry-run"\n')
    path = tmp_path / "ruleloop.toml"
    path.write_text("".join(lines))
    return path


@pytest.fixture(scope="module")
def bot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Database, Path]]:
    """A `ruleloop serve` process on SQLite in a temporary directory."""
    tmp_path = tmp_path_factory.mktemp("bot")
    db_url = f"sqlite:///{tmp_path / 'ruleloop.db'}"
    env = {**os.environ, "RULELOOP_CONFIG": str(bot_config(tmp_path)),
           "RULELOOP_DATABASE_URL": db_url, "RULELOOP_ALERTMANAGER_TOKEN": AM_TOKEN}  # fmt: skip
    for name in ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_APP_TOKEN"):
        env.pop(name, None)
    port = free_port()
    argv = [sys.executable, "-c", "from bot.app.cli import main; main()", "serve", "--port",
            str(port), "--state-dir", str(tmp_path / "state")]  # fmt: skip
    proc = Process(argv, log=tmp_path / "serve.log", env=env)
    url = f"http://127.0.0.1:{port}"
    db = Database(db_url)
    try:
        proc.wait_ready(f"{url}/readyz", timeout=120)
        yield url, db, proc.log
    finally:
        db.dispose()
        proc.stop()


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, bot: tuple[str, Database, Path]
) -> Iterator[Stack]:
    """The shipped Alertmanager config pointed at the served bot, with short group timers."""
    tmp_path = tmp_path_factory.mktemp("am")
    config = yaml.safe_load(CONFIG.read_text())
    # group_interval is also Alertmanager's deadline for a notification (10 s at the least):
    # 10 s failed notifications the bot answered late on a loaded machine; 1 m, as shipped 5 m
    config["route"].update(group_wait="1s", group_interval="1m")
    (tmp_path / "token").write_text(AM_TOKEN)
    [hook] = [h for r in config["receivers"] for h in r.get("webhook_configs", [])]
    assert hook["max_alerts"] == MAX_ALERTS
    hook["url"] = f"{bot[0]}/alertmanager"
    hook["http_config"]["authorization"]["credentials_file"] = str(tmp_path / "token")
    readiness = Readiness(bot[0])
    poller = threading.Thread(target=readiness.run, daemon=True)
    poller.start()
    with running_alertmanager(tmp_path, config) as am:
        yield Stack(bot=bot[0], am=am, db=bot[1], log=bot[2], readiness=readiness)
    readiness._stop.set()
    poller.join()


def counter(url: str, name: str, **labels: str) -> float:
    """The sum of a counter's samples at ``url``/metrics whose labels include ``labels``."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == f"{name}_total" and labels.items() <= s.labels.items()
    )


def incident_sizes(db: Database) -> dict[str, int]:
    """Each incident's instance (its alerts') and how many alerts it holds."""
    with db.transaction() as s:
        return {i.alerts[0].labels["instance"]: len(i.alerts) for i in store_reads.incidents(s)}


def wait_for(stack: Stack, expected: dict[str, int]) -> dict[str, int]:
    """The incidents once every expected instance has its alerts, or what there is at WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while True:
        sizes = incident_sizes(stack.db)
        if all(sizes.get(i) == n for i, n in expected.items()) or time.monotonic() > deadline:
            return sizes
        time.sleep(0.5)


@settings(
    max_examples=8, derandomize=True, deadline=None, database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each example takes seconds
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip
@given(groups=st.lists(GROUP, min_size=1, max_size=5))
def test_every_group_through_alertmanager_becomes_one_incident(
    stack: Stack, groups: list[tuple[int, bool]]
) -> None:
    before = incident_sizes(stack.db)
    expected: dict[str, int] = {}
    for size, known in groups:
        if known:
            instance = engine_of(next(stack.free_targets))
        else:
            instance = f"10.9.{next(stack.unknown)}.5:8000"
        sent = [kube_alert(n, instance) for n in range(size)]
        answer = httpx.post(f"{stack.am}/api/v2/alerts", json=sent, timeout=60)
        assert answer.status_code == 200, answer.text
        expected[instance] = min(size, MAX_ALERTS)
    sizes = wait_for(stack, expected)
    new = {i: n for i, n in sizes.items() if i not in before}
    assert new == expected, (groups, stack.log.read_text()[-3000:])
    assert counter(stack.am, "alertmanager_notifications_failed", integration="webhook") == 0
    assert counter(stack.bot, "ruleloop_webhooks", outcome="rejected") == 0
    log = stack.log.read_text()
    assert "Traceback" not in log and "unexpected error" not in log, log[-3000:]
    assert stack.readiness.polls > 0 and stack.readiness.failures == []
    print(json.dumps({"groups": groups, "incidents": len(sizes)}))
