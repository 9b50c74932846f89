"""Faults at the bot's HTTP doors (docs/reliability.md): huge, deep, repeated and over-long
requests get a clear 4xx at once, never a swollen process, a 500 or a 503 retry loop."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bot.app.routes import endpoints
from bot.incidents.intake.models import parse_webhook
from bot.incidents.intake.service import Intake, IntakeOutcome
from bot.kernel.store.db import Database
from tests import store_reads
from tests.fakes.alerts import alert, body, payload
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import FakeSlack
from tests.test_bot_store import new_database, postgres  # noqa: F401  (the real PostgreSQL server fixture)
from tests.traced import peak_of

pytestmark = pytest.mark.faults

CHUNK = 64 * 1024


class Sent:
    """A request body streamed in 64 KiB chunks that counts how much the server pulled."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.pulled < self.total:
            self.pulled += CHUNK
            yield b"x" * CHUNK


@pytest.fixture
async def h(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[Harness]:
    harness_ = harness(tmp_path, slack=slack)
    yield harness_
    await harness_.close()


@pytest.mark.parametrize("route", ["/slack/events", "/alertmanager"])
async def test_a_huge_streamed_body_is_refused_after_the_limit_not_read_whole(
    h: Harness, slack: FakeSlack, route: str
) -> None:
    """Item 1: 64 MiB, unsigned (or after the token): 413 once 1 MiB is read, not all of it."""
    sent = Sent(64 << 20)
    headers = {
        "Authorization": "Bearer am-secret-token-0123456789",
        "Content-Type": "application/json",
    }
    response = await h.client.post(route, content=sent, headers=headers)  # type: ignore[arg-type]
    assert response.status_code == 413, response.text
    assert "over 1048576 bytes" in response.json()["error"]
    assert sent.pulled <= (1 << 20) + CHUNK, f"read {sent.pulled} bytes of a refused body"
    assert slack.calls == []


async def test_a_declared_length_over_the_limit_is_refused_before_reading(h: Harness) -> None:
    sent = Sent(2 << 20)
    headers = {"Content-Length": str(2 << 20), "X-Slack-Signature": "v0=00"}
    response = await h.client.post("/slack/events", content=sent, headers=headers)  # type: ignore[arg-type]
    assert response.status_code == 413 and sent.pulled == 0


async def test_the_body_limit_is_a_setting(tmp_path: Path, slack: FakeSlack) -> None:
    h = harness(tmp_path, slack=slack, server={"max_body_bytes": 4096})
    try:
        response = await h.webhook(body(alert(), junk="x" * 5000))
        assert response.status_code == 413 and "over 4096 bytes" in response.json()["error"]
        assert (await h.webhook(body(alert()))).status_code == 202
    finally:
        await h.close()


async def test_the_same_alert_twice_in_one_payload_opens_one_incident(
    h: Harness, slack: FakeSlack
) -> None:
    """Item 10: was an IntegrityError on every retry (503 forever)."""
    twice = body(alert(), alert())
    first = await h.webhook(twice)
    assert (first.status_code, first.json()["outcome"]) == (202, "opened"), first.text
    again = await h.webhook(twice)
    assert (again.status_code, again.json()["outcome"]) == (200, "duplicate")
    await h.bot.tasks.drain()
    with h.bot.db.transaction() as s:
        (incident,) = store_reads.incidents(s)
        assert len(incident.alerts) == 1


async def test_the_later_copy_of_a_repeated_alert_wins(h: Harness) -> None:
    """A firing and a resolved copy of one instance in one payload: the last one is its state."""
    mixed = body(alert(), alert(status="resolved"), status="firing")
    assert (await h.webhook(mixed)).status_code == 202
    await h.bot.tasks.drain()
    with h.bot.db.transaction() as s:
        (incident,) = store_reads.incidents(s)
        assert [a.status for a in incident.alerts] == ["resolved"]


async def test_a_deeply_nested_body_is_a_400_not_a_500(h: Harness) -> None:
    """Item 11: 200k nested arrays made json.loads raise RecursionError (500)."""
    deep = b"[" * 200_000 + b"]" * 200_000
    response = await h.webhook(deep)
    assert response.status_code == 400, response.text
    assert "nested too deeply" in response.json()["error"]
    nested = json.dumps(payload(alert())).encode()[:-1] + b', "x": ' + deep + b"}"
    assert (await h.webhook(nested)).status_code == 400


@pytest.fixture
def pg_store(postgres: str) -> Iterator[str]:  # noqa: F811
    """A new, empty database on the real PostgreSQL server."""
    yield new_database(postgres, prefix="f")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"fingerprint": "f" * 65}, "alerts.0.fingerprint"),
        ({"startsAt": "2026-09-01T02:13:07." + "1" * 60 + "Z"}, "alerts.0.startsAt"),
        ({"endsAt": "x" * 65}, "alerts.0.endsAt"),
        ({"groupKey": "g" * 513}, "groupKey"),
    ],
)
async def test_over_long_keys_are_a_422_on_postgresql_not_a_503_loop(
    tmp_path: Path, pg_store: str, change: dict[str, str], field: str
) -> None:
    """Item 12: PostgreSQL refused them (DataError), so every retry answered 503."""
    h = harness(tmp_path, slack=None, store={"url": pg_store})
    try:
        sent = payload(alert())
        if "groupKey" in change:
            sent.update(change)
        else:
            sent["alerts"][0].update(change)
        response = await h.webhook(json.dumps(sent).encode())
        assert response.status_code == 422, response.text
        assert response.json()["error"].startswith(
            f"not an Alertmanager webhook v4 payload: {field}"
        )
        with h.bot.db.transaction() as s:
            assert store_reads.incidents(s) == []
    finally:
        await h.close()


def _timed_group(intake: Intake, n: int, key: str) -> float:
    """Seconds to open a group of ``n`` alerts, then resolve half of them (the write lock's
    hold: both run inside one BEGIN IMMEDIATE each)."""
    firing = [alert(fingerprint=f"{i:016x}", instance=f"10.0.{i // 250}.{i % 250}:8000")
              for i in range(n)]  # fmt: skip
    resolved = [{**a, "status": "resolved"} for a in firing[: n // 2]]
    hooks = [parse_webhook(body(*firing, group_key=key)),
             parse_webhook(body(*resolved, *firing[n // 2 :], group_key=key))]  # fmt: skip
    started = time.perf_counter()
    outcomes = [intake.receive(hook).outcome for hook in hooks]
    assert outcomes == [IntakeOutcome.OPENED, IntakeOutcome.UPDATED]
    return time.perf_counter() - started


def test_a_notification_of_thousands_of_alerts_is_linear_under_the_write_lock(
    tmp_path: Path,
) -> None:
    """Issue 31 item 3: 3,000 alerts held SQLite's write lock 45 s (``a not in new`` and
    ``names.count`` per alert: quadratic), so /readyz, the outbox and the jobs were locked out."""
    db = Database(f"sqlite:///{tmp_path / 'incidents.db'}")
    db.create_schema()
    intake = Intake(db=db, targets={}, clock=lambda: dt.datetime(2026, 9, 1, tzinfo=dt.UTC))
    small = _timed_group(intake, 500, "small")
    big = _timed_group(intake, 3000, "big")
    # linear: 6x the alerts take about 6x the time (quadratic was over 20x)
    assert big < 10 * small + 0.5, f"500 alerts {small:.2f} s, 3,000 alerts {big:.2f} s"


async def test_deep_nesting_is_refused_before_anything_is_built(h: Harness) -> None:
    """Issue 31 item 5: a 1 MB body 800 deep took serve from 46 MB to 3.5 GB (a path as long as
    the nesting per value, built on the event loop) before its 422; this 42 KB one took 130 MB."""
    deep = b"[" * 800 + b"1," * 20_000 + b"1" + b"]" * 800
    sent = json.dumps(payload(alert())).encode()[:-1] + b', "x": ' + deep + b"}"
    response, peak = await peak_of(h.webhook(sent))
    assert response.status_code == 400, response.text
    assert "nested too deeply (over 32 levels" in response.json()["error"]
    assert peak < 20 << 20, f"peak {peak >> 20} MiB for a {len(sent) >> 10} KiB body"


async def test_brackets_in_strings_and_extra_fields_within_the_limit_are_accepted(
    h: Harness,
) -> None:
    """The depth is read on the bytes: a bracket inside a string is text, not nesting."""
    sent = payload(alert(summary='[{"x": [' * 200))
    sent["extra"] = json.loads("[" * 30 + "]" * 30)  # 31 levels with the payload's own
    response = await h.webhook(json.dumps(sent).encode())
    assert response.status_code == 202, response.text


async def test_a_flood_of_webhooks_is_parsed_a_few_at_a_time(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45 item 5: 16 big notifications at once were 16 parses at once (+80 MiB of objects
    measured by bench/hostile_bodies.py; +38 MiB with this bound). Every one is still answered;
    at most PARSE_AT_ONCE are parsed together. Made to fail by removing the bound (16 at once)."""
    running, most, lock = 0, 0, threading.Lock()
    real = endpoints.parse_webhook

    def counted(data: bytes) -> object:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            time.sleep(0.05)  # long enough for every request to be waiting at once
            return real(data)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(endpoints, "parse_webhook", counted)
    sent = [body(alert(instance=f"10.0.0.{i}:8000")) for i in range(16)]
    answers = await asyncio.gather(*(h.webhook(b) for b in sent))
    assert {a.status_code for a in answers} <= {200, 202}, [a.text for a in answers]
    assert most == endpoints.PARSE_AT_ONCE == 2
