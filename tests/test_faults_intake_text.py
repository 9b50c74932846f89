"""Text the store cannot hold (docs/reliability.md): a NUL character (or a lone surrogate) in an
alert's name, a group label, the fingerprint or the groupKey is a 422 at intake naming the
field, on real PostgreSQL and SQLite alike, never a 503 that Alertmanager retries forever; and
were intake ever to let such a value through, the store's refusal is still a 4xx, not a 503."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.incidents.intake import models
from tests import store_reads
from tests.fakes.alerts import alert, payload
from tests.fakes.bot import harness
from tests.test_bot_store import new_database, postgres  # noqa: F401  (the real PostgreSQL server fixture)

pytestmark = pytest.mark.faults


@pytest.fixture
def pg_store(postgres: str) -> Iterator[str]:  # noqa: F811
    """A new, empty database on the real PostgreSQL server."""
    yield new_database(postgres, prefix="t")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> str | None:
    """None: the harness's SQLite; else a fresh database on the real PostgreSQL."""
    if request.param == "sqlite":
        return None
    url: str = request.getfixturevalue("pg_store")
    return url


def _alertname(sent: dict[str, Any], bad: str) -> None:
    sent["alerts"][0]["labels"]["alertname"] = bad


def _group_label(sent: dict[str, Any], bad: str) -> None:
    sent["groupLabels"]["instance"] = bad


def _fingerprint(sent: dict[str, Any], bad: str) -> None:
    sent["alerts"][0]["fingerprint"] = bad


def _group_key(sent: dict[str, Any], bad: str) -> None:
    sent["groupKey"] = bad


CHANGES = {
    "alerts.0.labels.alertname": _alertname,
    "groupLabels.instance": _group_label,
    "alerts.0.fingerprint": _fingerprint,
    "groupKey": _group_key,
}


@pytest.mark.parametrize("field", list(CHANGES))
@pytest.mark.parametrize(("bad", "why"), [("a\x00b", "NUL"), ("a\ud800b", "surrogate")])
async def test_text_the_store_cannot_hold_is_a_422_naming_the_field(
    tmp_path: Path, store_url: str | None, field: str, bad: str, why: str
) -> None:
    """PostgreSQL refused a NUL (DataError), answered 503, so Alertmanager retried forever;
    SQLite took it (202): the same payload now gets the same 422 on both."""
    extra: dict[str, Any] = {"store": {"url": store_url}} if store_url else {}
    h = harness(tmp_path, slack=None, **extra)
    try:
        sent = payload(alert())
        CHANGES[field](sent, bad)
        for _ in range(2):  # a retry gets the same answer
            response = await h.webhook(json.dumps(sent).encode())
            assert response.status_code == 422, response.text
            error = response.json()["error"]
            assert error.startswith(f"not an Alertmanager webhook v4 payload: {field}: "), error
            assert why in error
        with h.bot.db.transaction() as s:
            assert store_reads.incidents(s) == []
        sent = payload(alert())  # the store still takes the next good notification
        assert (await h.webhook(json.dumps(sent).encode())).status_code == 202
    finally:
        await h.close()


async def test_a_value_the_store_refuses_is_a_422_not_store_unavailable(
    tmp_path: Path, pg_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were intake ever to miss a case, PostgreSQL's DataError is the input's fault: a 422
    (Alertmanager does not retry it), not "the incident store is unavailable" (503)."""
    monkeypatch.setattr(models, "refuse_unstorable", lambda data: None)  # intake misses it
    h = harness(tmp_path, slack=None, store={"url": pg_store})
    try:
        sent = payload(alert())
        _fingerprint(sent, "a\x00b")
        response = await h.webhook(json.dumps(sent).encode())
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert "the incident store refused a value of this notification" in error
        assert "unavailable" not in error
        with h.bot.db.transaction() as s:
            assert store_reads.incidents(s) == []
    finally:
        await h.close()
