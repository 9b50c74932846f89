"""Alertmanager intake: payload parsing and dedupe (retries, repeats, out-of-order, resolved)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from bot.incidents.intake.models import parse_time, parse_webhook
from bot.incidents.intake.service import Intake, IntakeOutcome
from bot.kernel.config import Target
from bot.kernel.errors import RequestRejected
from bot.kernel.store import service as store
from bot.kernel.store.db import Database
from tests import store_reads
from tests.fakes.alerts import alert, body, payload

T0 = dt.datetime(2026, 9, 1, 2, 13, tzinfo=dt.UTC)
TARGETS = {
    "prod-a": Target(vllm_url="http://10.0.0.5:8000"),
    "prod-b": Target(vllm_url="http://10.0.0.6:8000"),
    "fleet": Target(
        vllm_url="http://vllm.inference.svc:8000",
        replicas=[f"http://10.1.0.{i}:8000" for i in range(1, 9)],
    ),
}


@pytest.fixture
def db(tmp_path: Path) -> Database:
    database = Database(f"sqlite:///{tmp_path / 'incidents.db'}")
    database.create_schema()
    return database


@pytest.fixture
def intake(db: Database) -> Intake:
    return Intake(db=db, targets=TARGETS, clock=lambda: T0)


def receive(intake: Intake, *alerts: dict, **kwargs: object):  # type: ignore[no-untyped-def]
    return intake.receive(parse_webhook(body(*alerts, **kwargs)))


def test_parse_tolerates_unknown_fields() -> None:
    hook = parse_webhook(body(alert(), futureField={"x": 1}))
    assert hook.group_key.startswith("{}:") and hook.alerts[0].fingerprint == "4f1e0c55a3b2d9e1"
    assert hook.title == "VLLMTimeToFirstTokenP99High"


@pytest.mark.parametrize(
    ("raw", "status", "message"),
    [
        (b"{not json", 400, "body is not JSON"),
        (b"[]", 400, "must be a JSON object"),
        (json.dumps(payload(version="3")).encode(), 422, "version"),
        (json.dumps(payload(alerts=[])).encode(), 422, "alerts"),
        (json.dumps(payload(alert(starts_at="yesterday"))).encode(), 422, "startsAt"),
        (json.dumps({**payload(), "groupKey": ""}).encode(), 422, "groupKey"),
    ],
)
def test_parse_refuses_with_reason(raw: bytes, status: int, message: str) -> None:
    with pytest.raises(RequestRejected, match=message) as info:
        parse_webhook(raw)
    assert info.value.status == status


def test_parse_time_nanoseconds() -> None:
    assert parse_time("2026-09-01T02:13:07.861234567Z") == dt.datetime(
        2026, 9, 1, 2, 13, 7, 861234, tzinfo=dt.UTC
    )


def test_intake_opens_once_whatever_is_retried(intake: Intake, db: Database) -> None:
    first = receive(intake, alert())
    assert first.outcome is IntakeOutcome.OPENED
    for _ in range(3):  # Alertmanager retries and repeat_interval re-sends
        again = receive(intake, alert())
        assert (again.outcome, again.incident_id) == (IntakeOutcome.DUPLICATE, first.incident_id)
    with db.transaction() as s:
        (incident,) = store_reads.incidents(s)
        assert incident.target == "prod-a" and len(incident.alerts) == 1
        assert [e.action for e in store_reads.audit_trail(s)] == ["incident.opened"]


def test_intake_new_instance_joins_open_incident(intake: Intake, db: Database) -> None:
    """Another replica of the same target joins (10.0.0.6 is prod-b's: it would not)."""
    first = receive(intake, alert(instance="10.1.0.1:8000"))
    second = receive(
        intake, alert(instance="10.1.0.1:8000"), alert(fingerprint="aa", instance="10.1.0.2:8000")
    )
    assert (second.outcome, second.incident_id) == (IntakeOutcome.UPDATED, first.incident_id)
    with db.transaction() as s:
        assert len(store.get(s, first.incident_id).alerts) == 2  # type: ignore[union-attr]


def test_intake_resolved_closes_and_late_firing_is_stale(intake: Intake, db: Database) -> None:
    opened = receive(intake, alert())
    resolved = receive(intake, alert(status="resolved"))
    assert (resolved.outcome, resolved.incident_id) == (IntakeOutcome.RESOLVED, opened.incident_id)
    assert receive(intake, alert(status="resolved")).outcome is IntakeOutcome.DUPLICATE
    late = receive(intake, alert())  # the firing retry arrives after the resolution
    assert (late.outcome, late.incident_id) == (IntakeOutcome.DUPLICATE, opened.incident_id)
    assert "resolved" in late.reason
    with db.transaction() as s:
        (incident,) = store_reads.incidents(s)
        assert incident.status == "resolved" and incident.closed_at == T0


def test_intake_resolved_without_firing_creates_closed(intake: Intake, db: Database) -> None:
    result = receive(intake, alert(status="resolved"))
    assert result.outcome is IntakeOutcome.RESOLVED and "never seen" in result.reason
    assert (
        receive(intake, alert()).outcome is IntakeOutcome.DUPLICATE
    )  # the firing one, out of order
    with db.transaction() as s:
        (incident,) = store_reads.incidents(s)
        assert incident.status == "resolved"
        assert store_reads.audit_trail(s)[0].detail["firing_seen"] is False


def test_intake_next_episode_is_a_new_incident(intake: Intake) -> None:
    first = receive(intake, alert())
    receive(intake, alert(status="resolved"))
    again = receive(intake, alert(starts_at="2026-09-01T05:00:00Z"))
    assert again.outcome is IntakeOutcome.OPENED and again.incident_id != first.incident_id


def test_intake_stores_starts_at_as_sent_and_the_time_it_says(intake: Intake, db: Database) -> None:
    """startsAt is parsed once, at intake, and kept beside its text: the diagnosis's chart
    reads the time, never the text again. Made to fail by storing no time (the chart then has
    no alert mark) or a time in another zone."""
    sent = "2026-09-01T07:00:00.123456789+02:00"  # Alertmanager's nanoseconds, not UTC
    receive(intake, alert(starts_at=sent))
    with db.transaction() as s:
        (incident,) = store_reads.incidents(s)
        (stored,) = incident.alerts
        assert stored.starts_at == sent  # half of the dedupe key, exactly as sent
        assert stored.started_at == dt.datetime(2026, 9, 1, 5, 0, 0, 123456, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("labels", "target"),
    [
        ({"instance": "10.0.0.6:8000"}, "prod-b"),
        ({"instance": "10.0.0.9:8000", "ruleloop_target": "prod-a"}, "prod-a"),
        ({"instance": "10.0.0.9:8000"}, None),
    ],
)
def test_intake_target_from_labels(intake: Intake, labels: dict, target: str | None) -> None:
    hook = parse_webhook(body(alert(**labels)))
    assert [t for t, _ in intake.by_target(hook)] == [target]


def pod(i: int, *, status: str = "firing") -> bytes:
    """Replica i's TTFT alert of the fleet, in its own group (Alertmanager groups by instance)."""
    instance = f"10.1.0.{i}:8000"
    return body(
        alert(instance=instance, fingerprint=f"pod{i}", status=status),
        group_key=f'{{}}:{{instance="{instance}"}}',
    )


def test_a_fleet_wide_regression_is_one_incident_until_every_replica_resolves(
    intake: Intake,
    db: Database,
) -> None:
    results = [intake.receive(parse_webhook(pod(i))) for i in range(1, 9)]
    assert [r.outcome for r in results] == [IntakeOutcome.OPENED] + [IntakeOutcome.UPDATED] * 7
    assert len({r.incident_id for r in results}) == 1
    for i in range(1, 8):  # seven replicas recover; one is still slow
        partial = intake.receive(parse_webhook(pod(i, status="resolved")))
        assert partial.outcome is IntakeOutcome.UPDATED
    last = intake.receive(parse_webhook(pod(8, status="resolved")))
    assert (last.outcome, last.incident_id) == (IntakeOutcome.RESOLVED, results[0].incident_id)
    with db.transaction() as s:
        (incident,) = store_reads.incidents(s)
        assert incident.target == "fleet" and incident.status == "resolved"
        assert len(incident.alerts) == 8
        lines = [o.payload["text"] for o in store_reads.outbox(s) if o.kind == "reply"]
    assert any("1 of 8 still firing" in line for line in lines), lines


def test_alerts_of_two_targets_stay_two_incidents(intake: Intake) -> None:
    fleet = intake.receive(parse_webhook(pod(1)))
    other = receive(intake, alert(instance="10.0.0.6:8000", fingerprint="b"), group_key="b")
    unknown = receive(intake, alert(instance="10.9.9.9:8000", fingerprint="c"), group_key="c")
    assert {fleet.outcome, other.outcome, unknown.outcome} == {IntakeOutcome.OPENED}
    assert len({fleet.incident_id, other.incident_id, unknown.incident_id}) == 3


def test_intake_racing_twins_make_one_incident(intake: Intake, db: Database) -> None:
    from concurrent.futures import ThreadPoolExecutor

    hook = parse_webhook(body(alert()))
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: intake.receive(hook), range(8)))
    assert sorted(r.outcome for r in results).count(IntakeOutcome.OPENED) == 1
    assert len({r.incident_id for r in results}) == 1
    with db.transaction() as s:
        assert len(store_reads.incidents(s)) == 1


def test_group_of_several_alerts_title_and_labels() -> None:
    hook = parse_webhook(
        body(
            alert(name="VLLMQueueTimeP99High"),
            alert(fingerprint="b2", name="VLLMPreemptions"),
            group_key='{}:{instance="10.0.0.5:8000"}',
        )  # fmt: skip
    )
    hook = hook.model_copy(update={"common_labels": {"instance": "10.0.0.5:8000", "job": "vllm"}})
    assert hook.title == "VLLMPreemptions + VLLMQueueTimeP99High"
    assert hook.labels == {
        "instance": "10.0.0.5:8000",
        "job": "vllm",
        "alertname": "VLLMQueueTimeP99High",
    }
