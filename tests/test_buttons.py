"""Single-use buttons (bot.kernel.store.buttons) on a real SQLite store: the subject format, finding a
button, its expiry, a subject's live buttons, and the remediation records that call them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.kernel.store import buttons
from bot.kernel.store import service as store
from bot.kernel.store.db import Database
from bot.kernel.store.states import ACTIVE, IN_FLIGHT, ChangeState
from bot.remediation.records import ChangeRequest, RemediationRecords
from tests.fakes.clock import WallClock

T0 = dt.datetime(2026, 11, 29, 2, 0, tzinfo=dt.UTC)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'ruleloop.db'}")
    database.create_schema()
    yield database
    database.dispose()


def test_a_subject_round_trips_to_its_key() -> None:
    assert buttons.subject("remediation", 12) == "remediation:12"
    assert buttons.subject_key(buttons.subject("remediation", 12), "remediation") == "12"
    adr = "ADR-20261129-01"
    assert buttons.subject_key(buttons.subject("draft", adr), "draft") == adr


@pytest.mark.parametrize(
    "value",
    [
        "draft:ADR-20261129-01",  # another kind
        "remediations:12",  # a kind that only starts like it
        "remediation",  # no key
        "remediation:",  # an empty key
        "remediation:12:3",  # not one subject() makes
        ":12",
        "",
    ],
)
def test_subject_key_refuses_another_kind_or_a_malformed_subject(value: str) -> None:
    assert buttons.subject_key(value, "remediation") is None


def test_issued_buttons_are_found_listed_and_spent_together(db: Database) -> None:
    subject = buttons.subject("remediation", 7)
    expires = T0 + dt.timedelta(minutes=15)
    with db.transaction() as s:
        issued = buttons.issue(
            s, subject, ("approve", "deny"), incident_id=None, now=T0, expires_at=expires
        )
        other = buttons.issue(
            s, buttons.subject("remediation", 8), ("approve",), incident_id=None, now=T0
        )
    assert sorted(issued) == ["approve", "deny"]
    assert len(set(issued.values()) | set(other.values())) == 3  # every value is new
    with db.transaction() as s:
        found = buttons.find(s, issued["deny"])
        assert found is not None
        assert (found.kind, found.subject, found.used_at) == ("deny", subject, None)
        assert buttons.find(s, "no-such-button") is None
        assert buttons.live(s, subject) == issued  # not the other subject's
        assert buttons.expires_at(s, subject) == expires
        assert buttons.expires_at(s, buttons.subject("remediation", 8)) is None  # never expires
        buttons.spend(s, subject, user_id="U2", now=T0)
    with db.transaction() as s:
        assert buttons.live(s, subject) == {}
        spent = buttons.find(s, issued["approve"])
        assert spent is not None and (spent.used_by, spent.used_at) == ("U2", T0)
        assert buttons.live(s, buttons.subject("remediation", 8)) == other  # left alone


def test_an_expired_button_reports_when_it_expired(db: Database) -> None:
    expires = T0 + dt.timedelta(seconds=60)
    with db.transaction() as s:
        tokens = buttons.issue(
            s, buttons.subject("remediation", 3), ("approve",), incident_id=None, now=T0,
            expires_at=expires,
        )  # fmt: skip
        forever = buttons.issue(
            s, buttons.subject("draft", "ADR-1"), ("accept",), incident_id=None, now=T0
        )
    token = tokens["approve"]
    with db.transaction() as s:
        assert buttons.expired(s, token, T0 + dt.timedelta(seconds=59)) is None  # still usable
        assert buttons.expired(s, token, expires) == expires
        assert buttons.expired(s, token, expires + dt.timedelta(hours=1)) == expires
        assert buttons.expired(s, forever["accept"], expires + dt.timedelta(days=9)) is None
        assert buttons.expired_keys(s, "remediation", expires) == {"3"}
        assert buttons.expired_keys(s, "remediation", expires - dt.timedelta(seconds=1)) == set()
        assert buttons.expired_keys(s, "draft", expires + dt.timedelta(days=9)) == set()


def test_usable_is_the_condition_a_claim_checks(db: Database) -> None:
    expires = T0 + dt.timedelta(seconds=60)
    with db.transaction() as s:
        token = buttons.issue(
            s, "remediation:5", ("approve",), incident_id=None, now=T0, expires_at=expires
        )["approve"]
    with db.transaction() as s:
        assert s.scalar(buttons.usable(token, T0).select()) is True
        assert s.scalar(buttons.usable(token, expires).select()) is False
        assert s.scalar(buttons.usable("no-such-button", T0).select()) is False
        buttons.spend(s, "remediation:5", user_id="U1", now=T0)
        assert s.scalar(buttons.usable(token, T0).select()) is False


async def test_remediation_records_issue_and_read_its_buttons(db: Database) -> None:
    wall = WallClock(T0)
    records = RemediationRecords(db=db, clock=wall.now)
    with db.transaction() as s:
        incident_id = store.create(
            s, key="g", source="slash", title="t", target="prod-a", labels={}, at=T0
        ).id
    rem, tokens = await records.create(
        ChangeRequest(
            incident_id=incident_id, channel_id=None, adr_id="ADR-20261129-01",
            target="prod-a", user_id="U1", two_person=False, change={"block-size": 32},
            before={}, after_flags={}, gateway_rules=None, ttl_s=60,
        )
    )  # fmt: skip
    subject = buttons.subject("remediation", rem.id)
    assert rem.state == ChangeState.PENDING == "pending"
    assert await records.tokens(subject) == tokens and sorted(tokens) == ["approve", "deny"]
    row = await records.token(tokens["approve"])
    assert row is not None and (row.subject, row.incident_id) == (subject, incident_id)
    assert await records.expires_at(subject) == T0 + dt.timedelta(seconds=60)
    assert await records.expired_pending() == []
    wall.advance(60)
    assert [r.id for r in await records.expired_pending()] == [rem.id]


def test_states_are_the_stored_strings() -> None:
    assert [str(state) for state in IN_FLIGHT] == [
        "pending", "approved", "applying", "canary", "promoting", "rolling_back",
    ]  # fmt: skip
    assert sorted(ACTIVE) == ["applying", "approved", "canary", "promoting", "rolling_back"]
    assert ChangeState("rolled_back") is ChangeState.ROLLED_BACK
    assert f"{ChangeState.DRY_RUN}" == "dry_run"
