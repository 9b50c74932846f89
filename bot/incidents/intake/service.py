"""Turns Alertmanager notifications into incidents: one per group episode, never a duplicate.

Rules:
- an alert instance is (fingerprint, startsAt); an instance already stored never adds anything,
  whatever Alertmanager retries, repeats or delivers out of order;
- a target has at most one open incident from Alertmanager, and so does a group key whose target
  is not known: Alertmanager groups by instance, so a fleet-wide regression on 8 replicas comes as
  8 groups, and they are one incident (one thread, one diagnosis of the fleet, one /apply-adr);
  new firing instances join it, and what joins or changes state in an open incident is one
  message in its thread ("X joined (firing)");
- a resolved notification closes the incident once none of its alerts is firing (other groups
  of the same target may still be), creating it closed if its firing was never seen;
- everything one notification changes commits in one transaction, audit entry included, and so
  do the Slack messages and the diagnosis it makes owed (``bot.kernel.store.outbox``, sent by
  ``bot.incidents.outbox``): a 202 never loses them;
- a repeat of an incident whose messages Slack did not take yet makes them due again at once;
- an alert joins only its own target's incident: a group that spans targets (a route grouped by
  alertname) is filed per target, each alert by its own labels; alerts of no known target are
  one incident per group key, kept apart from every key the bot makes (``group:``), so a group
  key spelled ``target:prod-b`` never joins prod-b's incident.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from bot.incidents.intake.models import Webhook, WebhookAlert
from bot.kernel import Target
from bot.kernel.chat import escape
from bot.kernel.store import Alert, Database, Incident
from bot.kernel.store import outbox as items
from bot.kernel.store import service as store

TARGET_LABEL = "ruleloop_target"
NEWS_LINES = 10  # alerts named in one thread line about the alerts that changed
# Tries of one notification against concurrent ones (each lost race is one commit by another)
RACE_ATTEMPTS = 8


class IntakeOutcome(StrEnum):
    """What a notification did."""

    OPENED = "opened"  # a new incident: diagnose it
    UPDATED = "updated"  # new alert instances joined an open incident
    RESOLVED = "resolved"  # the incident is closed: update its root message
    DUPLICATE = "duplicate"  # nothing new (a retry, a repeat, or a late out-of-order copy)


FIRST = list(IntakeOutcome)  # a notification's answer: an opened incident before the rest


@dataclass(frozen=True)
class IntakeResult:
    """The outcome, the incident concerned, and a reason a person can read."""

    outcome: IntakeOutcome
    incident_id: int
    reason: str
    owed: int = 0  # Slack messages of the incident made due again (a repeat of an undelivered one)


class Intake:
    """Receives parsed webhooks into the incident store."""

    def __init__(
        self,
        *,
        db: Database,
        targets: Mapping[str, Target],
        clock: Callable[[], dt.datetime],
    ) -> None:
        self._db = db
        self._targets = targets
        self._clock = clock

    def receive(self, webhook: Webhook) -> IntakeResult:
        """Record one notification: its first outcome (``receive_all`` has one per target)."""
        return self.receive_all(webhook)[0]

    def receive_all(self, webhook: Webhook) -> list[IntakeResult]:
        """Record one notification, its alerts filed per target (one outcome each, an opened
        incident first); a concurrent twin that wins the race makes a part a duplicate, and a
        concurrent group of the same target that opens its incident first makes it join."""
        results = [self._receive_part(part, target) for target, part in self.by_target(webhook)]
        return sorted(results, key=lambda r: FIRST.index(r.outcome))

    def _receive_part(self, webhook: Webhook, target: str | None) -> IntakeResult:
        for _ in range(RACE_ATTEMPTS - 1):
            try:
                return self._receive(webhook, target)
            except IntegrityError:
                # Another request stored the same instance or opened the same incident first;
                # with many groups of one target at once the winner may itself lose a race and
                # roll back, so each try again reads what committed meanwhile.
                continue
        return self._receive(webhook, target)

    def by_target(self, webhook: Webhook) -> list[tuple[str | None, Webhook]]:
        """The notification split by the target each alert is about (its own labels), in the
        order first seen; a notification of one target is returned whole."""
        parts: dict[str | None, list[WebhookAlert]] = {}
        for alert in webhook.alerts:
            target = self._target_of({**webhook.common_labels, **alert.labels})
            parts.setdefault(target, []).append(alert)
        if len(parts) == 1:
            return [(next(iter(parts)), webhook)]
        return [
            (target, webhook.model_copy(update={"alerts": alerts, "status": _status(alerts)}))
            for target, alerts in parts.items()
        ]

    def _receive(self, webhook: Webhook, target: str | None) -> IntakeResult:
        now = self._clock()
        # what makes alerts one incident: their target, else their Alertmanager group
        key = f"target:{target}" if target is not None else f"group:{webhook.group_key}"
        with self._db.transaction() as session:
            incident = store.find_open(session, key=key)
            if incident is None and target is None:  # opened before keys had their "group:"
                legacy = store.find_open(session, key=webhook.group_key)
                incident = legacy if legacy is not None and legacy.target is None else None
            # each instance keyed and looked up once; linear, as all of this runs under the
            # write lock (a key without Alertmanager's fingerprint hashes the alert's labels)
            keyed = [(a, _key(a)) for a in webhook.alerts]
            found = [(a, key, store.find_alert(session, **key)) for a, key in keyed]
            new = [(a, key) for a, key, row in found if row is None]
            known = [(a, row) for a, _, row in found if row is not None]
            if incident is None:
                if not new:
                    old = known[0][1]
                    return _repeat(
                        session,
                        old.incident_id,
                        f"already recorded in incident {old.incident_id} "
                        f"({old.incident.status}); nothing changed",
                        now,
                    )
                incident = store.create(
                    session,
                    key=key,
                    source="alertmanager",
                    title=webhook.title,
                    target=target,
                    labels=webhook.labels,
                    at=now,
                    status=webhook.status,
                )
                opened = True
            else:
                opened = False
            joined = [
                store.add_alert(
                    session, incident, **key, started_at=alert.starts_at.at, status=alert.status,
                    ends_at=alert.ends_at, labels=alert.labels, annotations=alert.annotations,
                )
                for alert, key in new
            ]  # fmt: skip
            changed = self._update_known(session, incident, known)
            if not opened and not _all_resolved(session, webhook, incident) and (joined or changed):
                # the thread hears what changed, in the transaction that changed it
                text = alerts_news(session, incident, joined=joined, changed=changed)
                items.owe(session, incident.id, kind=items.REPLY, at=now, payload={"text": text})
            return self._conclude(
                session, incident, webhook, opened=opened, new=len(new), changed=len(changed),
                now=now,
            )  # fmt: skip

    def _update_known(
        self, session: Session, incident: Incident, known: list[tuple[WebhookAlert, Alert]]
    ) -> list[Alert]:
        changed = []
        for alert, row in known:
            if row.incident_id == incident.id and row.status != alert.status:
                row.status, row.ends_at = alert.status, alert.ends_at
                changed.append(row)
        session.flush()
        return changed

    def _conclude(
        self, session: Session, incident: Incident, webhook: Webhook, *, opened: bool, new: int,
        changed: int, now: dt.datetime,
    ) -> IntakeResult:  # fmt: skip
        detail: dict[str, object] = {
            "group_key": webhook.group_key, "status": webhook.status, "new_alerts": new,
        }  # fmt: skip
        if _all_resolved(session, webhook, incident):
            store.close(session, incident, at=now)
            detail["firing_seen"] = not opened
            self._audit(session, incident, "incident.resolved", detail, now)
            items.owe_root_change(session, incident.id, at=now)  # resolved, or its root at last
            why = "resolved (its firing notification was never seen)" if opened else "resolved"
            return IntakeResult(
                IntakeOutcome.RESOLVED, incident.id, f"incident {incident.id} {why}"
            )
        if opened:
            detail["target"] = incident.target
            self._audit(session, incident, "incident.opened", detail, now)
            items.owe_root(session, incident.id, at=now, channel=None)
            items.owe_diagnosis(session, incident.id, at=now)
            return IntakeResult(IntakeOutcome.OPENED, incident.id, f"incident {incident.id} opened")
        if new or changed:
            detail["changed"] = changed
            self._audit(session, incident, "incident.alerts_changed", detail, now)
            owed = items.rearm(session, incident.id, now=now)
            return IntakeResult(
                IntakeOutcome.UPDATED, incident.id,
                f"incident {incident.id}: {new} new alert(s)" + _owed_note(owed), owed,
            )  # fmt: skip
        return _repeat(
            session, incident.id, f"repeat of open incident {incident.id}; nothing changed", now
        )

    @staticmethod
    def _audit(
        session: Session, incident: Incident, action: str, detail: dict[str, object],
        now: dt.datetime,
    ) -> None:  # fmt: skip
        store.audit(
            session, at=now, actor="alertmanager", action=action, incident=incident, detail=detail
        )

    def _target_of(self, labels: Mapping[str, str]) -> str | None:
        """The configured target an alert is about: its label, else its instance (the target's
        engine or one of its listed replicas)."""
        named = labels.get(TARGET_LABEL)
        if named in self._targets:
            return named
        instance = labels.get("instance")
        for name, target in self._targets.items():
            if instance and instance in _instances(target):
                return name
        return None


def _all_resolved(session: Session, webhook: Webhook, incident: Incident) -> bool:
    """A resolved notification, and no alert of the incident (any group's) still firing: one
    indexed query, whatever the incident holds (loading its alerts cost 0.5 s at 10,000)."""
    if webhook.status != "resolved":
        return False
    session.flush()
    firing = select(Alert.id).where(Alert.incident_id == incident.id, Alert.status == "firing")
    return session.scalar(firing.limit(1)) is None


def _status(alerts: list[WebhookAlert]) -> str:
    """A part's status as Alertmanager would say it of a group: firing while any alert is."""
    return "firing" if any(a.status == "firing" for a in alerts) else "resolved"


def alerts_news(
    session: Session, incident: Incident, *, joined: list[Alert], changed: list[Alert]
) -> str:
    """The thread's line per alert that joined or changed state (mrkdwn), e.g.
    "`VLLMQueueTimeP99High` joined (firing)", "`VLLMx` resolved; 1 of 2 still firing".
    Counted in SQL, never by loading the incident's alerts: a notification costs the same at
    10 alerts and at 10,000 (loading them took 0.2 s at 10,000)."""
    session.flush()
    mine = Alert.incident_id == incident.id
    named: dict[str, int] = {}

    def name(alert: Alert) -> str:
        alertname = alert.labels.get("alertname")
        text = str(alertname or alert.fingerprint)
        if text not in named:  # the same alert on several instances of this incident
            same = (
                Alert.labels["alertname"].as_string() == str(alertname)
                if alertname
                else Alert.fingerprint == alert.fingerprint
            )
            named[text] = session.scalar(select(func.count()).where(mine, same)) or 0
        instance = alert.labels.get("instance")
        if named[text] > 1 and instance:
            text = f"{text} on {instance}"
        return f"`{escape(text[:200])}`"

    lines = [f"{name(a)} joined ({escape(a.status)})" for a in joined]
    lines += [f"{name(a)} {escape(a.status)}" for a in changed]
    shown = lines[:NEWS_LINES]
    if len(lines) > len(shown):
        shown.append(f"…and {len(lines) - len(shown)} more")
    if any(a.status != "firing" for a in [*joined, *changed]):
        by_status = select(Alert.status, func.count()).where(mine).group_by(Alert.status)
        counts = {str(status): int(n) for status, n in session.execute(by_status).all()}
        shown[-1] += f"; {counts.get('firing', 0)} of {sum(counts.values())} still firing"
    return "\n".join(shown)


def _repeat(session: Session, incident_id: int, reason: str, now: dt.datetime) -> IntakeResult:
    """A duplicate: nothing new, but what Slack never took of the incident is tried again now."""
    owed = items.rearm(session, incident_id, now=now)
    return IntakeResult(IntakeOutcome.DUPLICATE, incident_id, reason + _owed_note(owed), owed)


def _owed_note(owed: int) -> str:
    return f"; {owed} Slack message(s) not delivered yet, tried again now" if owed else ""


def _instances(target: Target) -> set[str]:
    """The `instance` labels Prometheus gives the target's engines: host:port of its URL and of
    each listed replica, of either pool too (never user info)."""
    listed = [*target.replicas, *target.prefill_replicas, *target.decode_replicas]
    return {target.hostport} | {urlsplit(url).netloc.rpartition("@")[2] for url in listed}


def _key(alert: WebhookAlert) -> dict[str, str]:
    fingerprint, starts_at = alert.key
    return {"fingerprint": fingerprint, "starts_at": starts_at}
