"""Store operations of the remediation flow, each one transaction with its audit entry.

State changes are conditional updates (``WHERE state IN (...)``): of two replicas, or two
clicks, racing for the same transition exactly one wins; the loser changes nothing.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from sqlalchemy import ColumnElement, Executable, or_, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from bot.errors import UsageError
from bot.remediation import exclusion
from bot.remediation.ports import ACTIVE
from bot.runtime.ids import new_token
from bot.store import service as store
from bot.store.db import Database
from bot.store.dbtime import db_ago, db_now
from bot.store.models import ActionToken, CanaryResult, Incident, Remediation


def _rows(session: Session, statement: Executable) -> int:
    """Rows an UPDATE changed."""
    return cast(CursorResult[Any], session.execute(statement)).rowcount


def _silent(seconds: float) -> ColumnElement[bool]:
    """No step or heartbeat for ``seconds``, on the database's clock."""
    return or_(Remediation.heartbeat_at.is_(None), Remediation.heartbeat_at < db_ago(seconds))


def _refuse_if_expired(session: Session, token: str, now: dt.datetime) -> None:
    """UsageError when the button ``token`` has expired (a lost claim that is not a race)."""
    row = session.scalars(select(ActionToken).where(ActionToken.token == token)).one_or_none()
    if row is None or row.used_at is not None or row.expires_at is None or row.expires_at > now:
        return
    raise UsageError(
        f"This button expired at {row.expires_at:%H:%M} UTC while the click was being checked. "
        "Nothing was changed; ask for the change again with `/apply-adr`."
    )


class RemediationRecords:
    """Remediations, their single-use buttons and canary results, on one database."""

    def __init__(self, *, db: Database, clock: Callable[[], dt.datetime]) -> None:
        self._db = db
        self._clock = clock

    @staticmethod
    def _open_incident(
        s: Session, *, target: str, user_id: str, channel_id: str | None, adr_id: str,
        now: dt.datetime,
    ) -> Incident:  # fmt: skip
        """The open incident of a target (newest), or a new one for this request."""
        query = (
            select(Incident)
            .where(Incident.target == target, Incident.open_key.is_not(None))
            .order_by(Incident.id.desc())
        )
        incident = s.scalars(query).first()
        if incident is not None:
            return incident
        return store.create(
            s,
            key=f"apply:{target}:{uuid.uuid4().hex[:12]}",
            source="slash",
            title=f"/apply-adr {adr_id} {target}",
            target=target,
            labels={"requested_by": user_id, **({"channel": channel_id} if channel_id else {})},
            at=now,
        )

    def in_flight(self, target: str) -> exclusion.Holder | None:
        """The remediation pending or running on ``target``, if any."""
        with self._db.transaction() as s:
            return exclusion.holder(s, target)

    def incident_target(self, incident_id: int) -> str | None:
        """The target an incident is about; UsageError when there is no such incident."""
        with self._db.transaction() as s:
            incident = store.get(s, incident_id)
            if incident is None:
                raise UsageError(f"there is no incident {incident_id}")
            return incident.target

    def create(
        self,
        *,
        incident_id: int | None,
        channel_id: str | None = None,
        adr_id: str,
        target: str,
        user_id: str,
        two_person: bool,
        change: Mapping[str, Any],
        before: Mapping[str, Any],
        after_flags: Mapping[str, Any],
        gateway_rules: Mapping[str, Any] | None,
        ttl_s: float,
    ) -> tuple[Remediation, dict[str, str]]:
        """A pending remediation with its approve/deny buttons, audited as requested, in the
        incident given (None: the target's open incident, or a new one, in the same
        transaction). TargetBusy when another remediation is in flight on the target."""
        now = self._clock()
        expires = now + dt.timedelta(seconds=ttl_s)
        try:
            with self._db.transaction() as s:
                exclusion.lock(s, target)
                busy = exclusion.holder(s, target)
                if busy is None:
                    incident = (
                        store.get(s, incident_id)
                        if incident_id is not None
                        else self._open_incident(
                            s,
                            target=target,
                            user_id=user_id,
                            channel_id=channel_id,
                            adr_id=adr_id,
                            now=now,
                        )  # fmt: skip
                    )
                    if incident is None:  # a button of an incident the store no longer has
                        raise UsageError(f"there is no incident {incident_id}")
                    return self._insert(
                        s, incident=incident, adr_id=adr_id, target=target, user_id=user_id,
                        two_person=two_person, change=change, before=before,
                        after_flags=after_flags, gateway_rules=gateway_rules, expires=expires,
                        now=now,
                    )  # fmt: skip
        except IntegrityError:
            # The unique index on in-flight targets: another request won the race. Nothing of
            # this one was kept (its incident, if new, went with the rolled-back transaction).
            busy = self.in_flight(target)
            if busy is None:
                raise
        assert busy is not None  # the transaction returned when the target was free
        raise exclusion.TargetBusy(busy)

    def _insert(
        self,
        s: Session,
        *,
        incident: Incident,
        adr_id: str,
        target: str,
        user_id: str,
        two_person: bool,
        change: Mapping[str, Any],
        before: Mapping[str, Any],
        after_flags: Mapping[str, Any],
        gateway_rules: Mapping[str, Any] | None,
        expires: dt.datetime,
        now: dt.datetime,
    ) -> tuple[Remediation, dict[str, str]]:
        rem = Remediation(
            incident_id=incident.id,
            adr_id=adr_id,
            target=target,
            requested_by=user_id,
            state="pending",
            approvals_needed=2 if two_person else 1,
            approved_by=[],
            change=dict(change),
            before=dict(before),
            after={"flags": dict(after_flags), "gateway": gateway_rules},
            result={},
            created_at=now,
            updated_at=now,
        )
        s.add(rem)
        s.flush()
        tokens = {kind: new_token() for kind in ("approve", "deny")}
        for kind, token in tokens.items():
            s.add(
                ActionToken(
                    token=token,
                    kind=kind,
                    subject=f"remediation:{rem.id}",
                    incident_id=incident.id,
                    created_at=now,
                    expires_at=expires,
                )
            )
        store.audit(
            s,
            at=now,
            actor=user_id,
            action="remediation.requested",
            incident=incident,
            detail={
                "remediation": rem.id,
                "adr": adr_id,
                "target": target,
                "change": dict(change),
                "before": dict(before),
                "two_person": two_person,
                "expires_at": expires.isoformat(),
            },
        )
        return rem, tokens

    def get(self, remediation_id: int) -> Remediation:
        """One remediation (it must exist)."""
        with self._db.transaction() as s:
            rem = s.get(Remediation, remediation_id)
            assert rem is not None, remediation_id
            return rem

    def token(self, value: str) -> ActionToken | None:
        """The button with this value, if any."""
        with self._db.transaction() as s:
            return s.scalars(select(ActionToken).where(ActionToken.token == value)).one_or_none()

    def tokens(self, subject: str) -> dict[str, str]:
        """The unused buttons of a subject, kind -> value."""
        with self._db.transaction() as s:
            rows = s.scalars(
                select(ActionToken).where(
                    ActionToken.subject == subject, ActionToken.used_at.is_(None)
                )
            ).all()
            return {row.kind: row.token for row in rows}

    def expires_at(self, subject: str) -> dt.datetime | None:
        """When a subject's buttons expire."""
        with self._db.transaction() as s:
            query = select(ActionToken.expires_at).where(ActionToken.subject == subject)
            return s.scalars(query).first()

    def claim(
        self,
        *,
        token: str,
        user_id: str,
        remediation_id: int,
        to_state: str,
        action: str,
        detail: Mapping[str, Any],
    ) -> bool:
        """Use a button: the pending remediation moves to ``to_state`` and all its buttons are
        spent, with the audit entry, in one transaction; False when someone else was first,
        UsageError when the button expired (even after the caller's own check)."""
        now = self._clock()
        # The expiry is part of the conditional UPDATE: the caller checked it before a Slack
        # call (user groups), and the button may have expired in between.
        usable = (
            select(ActionToken.id)
            .where(
                ActionToken.token == token,
                ActionToken.used_at.is_(None),
                or_(ActionToken.expires_at.is_(None), ActionToken.expires_at > now),
            )
            .exists()
        )
        with self._db.transaction() as s:
            moved = _rows(
                s,
                update(Remediation)
                .where(Remediation.id == remediation_id, Remediation.state == "pending", usable)
                .values(
                    state=to_state,
                    updated_at=now,
                    approved_by=[user_id] if to_state == "approved" else [],
                    heartbeat_at=db_now(),  # not started for long: its replica is gone
                ),
            )
            if moved != 1:
                _refuse_if_expired(s, token, now)
                return False
            s.execute(
                update(ActionToken)
                .where(
                    ActionToken.subject == f"remediation:{remediation_id}",
                    ActionToken.used_at.is_(None),
                )
                .values(used_at=now, used_by=user_id)
            )
            rem = s.get(Remediation, remediation_id)
            assert rem is not None
            store.audit(
                s,
                at=now,
                actor=user_id,
                action=action,
                incident=store.get(s, rem.incident_id),
                detail={"remediation": remediation_id, "token": token[:6], **detail},
            )
            return True

    def step(
        self,
        remediation_id: int,
        *,
        to_state: str,
        action: str,
        detail: Mapping[str, Any],
        from_states: Iterable[str] | None = None,
        owner: str | None = None,
        stale_s: float | None = None,
        actor: str = "ruleloop",
        **fields: Any,
    ) -> bool:
        """Audit a step, then move the remediation to ``to_state`` (one transaction); False,
        changing nothing, unless it is in one of ``from_states``, run by ``owner`` and (with
        ``stale_s``) silent that long on the database's clock."""
        now = self._clock()
        with self._db.transaction() as s:
            query = update(Remediation).where(Remediation.id == remediation_id)
            if from_states is not None:
                query = query.where(Remediation.state.in_(list(from_states)))
            if owner is not None:
                query = query.where(Remediation.runner == owner)
            if stale_s is not None:
                query = query.where(_silent(stale_s))
            values = {"state": to_state, "updated_at": now, "heartbeat_at": db_now(), **fields}
            moved = _rows(s, query.values(**values))
            if moved != 1:
                return False
            rem = s.get(Remediation, remediation_id)
            assert rem is not None
            store.audit(
                s,
                at=now,
                actor=actor,
                action=action,
                incident=store.get(s, rem.incident_id),
                detail={"remediation": remediation_id, "state": to_state, **detail},
            )
            return True

    def take(self, remediation_id: int, *, runner: str) -> bool:
        """Become the run of an approved remediation nobody runs yet; False if another has."""
        with self._db.transaction() as s:
            query = (
                update(Remediation)
                .where(
                    Remediation.id == remediation_id,
                    Remediation.state == "approved",
                    Remediation.runner.is_(None),
                )
                .values(runner=runner, heartbeat_at=db_now())
            )
            return _rows(s, query) == 1

    def heartbeat(self, remediation_id: int, *, runner: str) -> bool:
        """Say the run is alive (on the database's clock); False when it is no longer this
        runner's, or no longer running."""
        with self._db.transaction() as s:
            query = (
                update(Remediation)
                .where(
                    Remediation.id == remediation_id,
                    Remediation.runner == runner,
                    Remediation.state.in_(list(ACTIVE)),
                )
                .values(heartbeat_at=db_now())
            )
            return _rows(s, query) == 1

    def remember_card(self, remediation_id: int, *, channel: str, ts: str) -> None:
        """Where the card is, so every step updates that one message."""
        with self._db.transaction() as s:
            s.execute(
                update(Remediation)
                .where(Remediation.id == remediation_id)
                .values(channel=channel, ts=ts)
            )

    def add_canary(
        self, *, incident_id: int, remediation_id: int | None, label: str, passed: bool,
        report: Mapping[str, Any],
    ) -> int:  # fmt: skip
        """Keep a canary's full JSON report with the incident (the draft's matrix reads it)."""
        with self._db.transaction() as s:
            row = CanaryResult(
                incident_id=incident_id,
                remediation_id=remediation_id,
                label=label,
                passed=passed,
                report=dict(report),
                at=self._clock(),
            )
            s.add(row)
            s.flush()
            return row.id

    def stale(self, *, older_than_s: float, states: Iterable[str]) -> list[Remediation]:
        """Remediations in ``states`` whose run was silent longer than the limit, judged on
        the database's clock (replica clocks may disagree)."""
        with self._db.transaction() as s:
            query = select(Remediation).where(
                Remediation.state.in_(list(states)), _silent(older_than_s)
            )
            return list(s.scalars(query.order_by(Remediation.id)).all())

    def expired_pending(self) -> list[Remediation]:
        """Pending remediations whose buttons have expired."""
        now = self._clock()
        with self._db.transaction() as s:
            subjects = select(ActionToken.subject).where(
                ActionToken.subject.like("remediation:%"), ActionToken.expires_at <= now
            )
            ids = {int(subject.split(":")[1]) for subject in s.scalars(subjects)}
            if not ids:
                return []
            query = select(Remediation).where(
                Remediation.id.in_(ids), Remediation.state == "pending"
            )
            return list(s.scalars(query).all())
