"""Store operations of the remediation flow, each one transaction with its audit entry.

State changes are conditional updates (``WHERE state IN (...)``): of two replicas, or two
clicks, racing for the same transition exactly one wins; the loser changes nothing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from bot.canary import CanaryReport
from bot.change import exclusion, rows
from bot.kernel import UsageError
from bot.kernel.runtime import log_ids
from bot.kernel.store import (
    ACTIVE,
    ActionToken,
    CanaryResult,
    ChangeState,
    Database,
    Incident,
    Remediation,
    buttons,
    db_now,
)
from bot.kernel.store import service as store

log = logging.getLogger("ruleloop.remediation")

SUBJECT = "remediation"  # its buttons' subject: buttons.subject(SUBJECT, remediation_id)
S = ChangeState
# the states a remediation ends in: each is counted once, by the step that wrote it
ENDED = frozenset({S.PROMOTED, S.ROLLED_BACK, S.FAILED, S.CANCELLED, S.EXPIRED, S.INTERRUPTED,
                   S.DRY_RUN})  # fmt: skip


@dataclass(frozen=True)
class CanaryRecord:
    """A canary run to keep with the incident: the matrix row's label, its verdict and its
    full JSON report (the draft's matrix reads it)."""

    label: str
    passed: bool
    report: CanaryReport

    def row(self, *, incident_id: int, remediation_id: int | None, at: dt.datetime) -> CanaryResult:
        """The canary_results row."""
        return CanaryResult(
            incident_id=incident_id, remediation_id=remediation_id, label=self.label,
            passed=self.passed, report=self.report.json_dict(), at=at,
        )  # fmt: skip


@dataclass(frozen=True)
class ChangeRequest:
    """A change asked for and checked: what the pending remediation records."""

    incident_id: int | None  # None: the target's open incident, or a new one
    channel_id: str | None
    adr_id: str
    target: str
    user_id: str
    two_person: bool
    change: Mapping[str, Any]  # the ADR's flags
    before: Mapping[str, Any]  # what served (Deployed.to_json, and the gateway's limits)
    after_flags: Mapping[str, Any]
    gateway_rules: Mapping[str, Any] | None
    ttl_s: float  # how long its buttons may be used


def _audit(
    s: Session, rem: Remediation, *, now: dt.datetime, actor: str, action: str,
    detail: Mapping[str, Any],
) -> Remediation:  # fmt: skip
    """The audit entry of a remediation's step, in its incident, in the step's transaction;
    ``rem`` as the step wrote it (what the step returns, so its caller reads no more)."""
    store.audit(
        s, at=now, actor=actor, action=action, incident=store.get(s, rem.incident_id),
        detail={"remediation": rem.id, **detail},
    )  # fmt: skip
    return rem


def _written(s: Session, statement: Any) -> Remediation | None:
    """The remediation a conditional UPDATE wrote, as the database returned it (RETURNING: the
    write is its own read); None when no row matched."""
    return s.scalars(statement.returning(Remediation)).one_or_none()


def _refuse_if_expired(session: Session, token: str, now: dt.datetime) -> None:
    """UsageError when the button ``token`` has expired (a lost claim that is not a race)."""
    expired = buttons.expired(session, token, now)
    if expired is None:
        return
    raise UsageError(
        f"This button expired at {expired:%H:%M} UTC while the click was being checked. "
        "Nothing was changed; ask for the change again with `/apply-adr`."
    )


@dataclass(frozen=True)
class Taken:
    """A change this run took, and the newest change promoted on its target before it (None:
    none), read in the same transaction."""

    rem: Remediation
    promoted: Remediation | None


class RemediationRecords(rows.ChangeRecords, buttons.ButtonReads):
    """Remediations, their single-use buttons and canary results, on one database. Each step
    written is logged (at info, with the incident and change ids); ``ended`` hears the state of
    each remediation that ended (the bot's metrics count them)."""

    def __init__(
        self,
        *,
        db: Database,
        clock: Callable[[], dt.datetime],
        ended: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(db=db, clock=clock)
        self._ended = ended

    def _moved(self, rem: Remediation | None, action: str) -> Remediation | None:
        """A step written (None: none was): logged, and counted when it ended the change."""
        if rem is None:
            return None
        with log_ids(incident_id=rem.incident_id, change_id=rem.id):
            log.info("remediation %s: %s (%s)", rem.id, action, rem.state)
        if rem.state in ENDED and self._ended is not None:
            self._ended(str(rem.state))
        return rem

    @staticmethod
    def _open_incident(s: Session, request: ChangeRequest, *, now: dt.datetime) -> Incident:
        """The open incident of a target (newest), or a new one for this request."""
        query = (
            select(Incident)
            .where(Incident.target == request.target, Incident.open_key.is_not(None))
            .order_by(Incident.id.desc())
        )
        incident = s.scalars(query).first()
        if incident is not None:
            return incident
        channel = {"channel": request.channel_id} if request.channel_id else {}
        return store.create(
            s,
            key=f"apply:{request.target}:{uuid.uuid4().hex[:12]}",
            source="slash",
            title=f"/apply-adr {request.adr_id} {request.target}",
            target=request.target,
            labels={"requested_by": request.user_id, **channel},
            at=now,
        )

    async def in_flight(self, target: str) -> exclusion.Holder | None:
        """The remediation pending or running on ``target``, if any."""

        def run() -> exclusion.Holder | None:
            with self._db.transaction() as s:
                return exclusion.holder(s, target)

        return await asyncio.to_thread(run)

    async def incident_target(self, incident_id: int) -> str | None:
        """The target an incident is about; UsageError when there is no such incident."""

        def run() -> str | None:
            with self._db.transaction() as s:
                incident = store.get(s, incident_id)
                if incident is None:
                    raise UsageError(f"there is no incident {incident_id}")
                return incident.target

        return await asyncio.to_thread(run)

    async def offered_target(self, incident_id: int, adr_id: str, target: str | None) -> str | None:
        """The target of an Apply button's incident, when that incident's diagnosis offered
        ``adr_id`` there; UsageError otherwise. A button's value is text anyone who can edit a
        payload may change: what it may do is read here, from the store."""

        def run() -> str | None:
            with self._db.transaction() as s:
                incident = store.get(s, incident_id)
                if incident is None:
                    raise UsageError(f"there is no incident {incident_id}")
                if target is not None and target != incident.target:
                    raise UsageError(
                        f"This button does not match its incident: incident #{incident_id} is "
                        f"about {incident.target or 'no target'}, not {target}. "
                        "Nothing was changed."
                    )
                if adr_id not in incident.summary.matches:
                    raise UsageError(
                        f"{adr_id} is not an ADR that incident #{incident_id}'s diagnosis "
                        "matched. Nothing was changed."
                    )
                return incident.target

        return await asyncio.to_thread(run)

    async def create(self, request: ChangeRequest) -> tuple[Remediation, dict[str, str]]:
        """A pending remediation with its approve/deny buttons, audited as requested, in the
        incident given (None: the target's open incident, or a new one, in the same
        transaction). TargetBusy when another remediation is in flight on the target."""

        def run() -> tuple[Remediation, dict[str, str]]:
            now = self._clock()
            try:
                with self._db.transaction() as s:
                    busy = exclusion.holder(s, request.target)
                    if busy is None:
                        incident = (
                            store.get(s, request.incident_id)
                            if request.incident_id is not None
                            else self._open_incident(s, request, now=now)
                        )
                        if incident is None:  # a button of an incident the store no longer has
                            raise UsageError(f"there is no incident {request.incident_id}")
                        return self._insert(s, request, incident=incident, now=now)
            except IntegrityError:
                # The unique index on in-flight targets: another request won the race. Nothing of
                # this one was kept (its incident, if new, went with the rolled-back transaction).
                with self._db.transaction() as s:
                    busy = exclusion.holder(s, request.target)
                if busy is None:
                    raise
            assert busy is not None  # the transaction returned when the target was free
            raise exclusion.TargetBusy(busy)

        return await asyncio.to_thread(run)

    @staticmethod
    def _insert(
        s: Session, request: ChangeRequest, *, incident: Incident, now: dt.datetime
    ) -> tuple[Remediation, dict[str, str]]:
        expires = now + dt.timedelta(seconds=request.ttl_s)
        rem = Remediation(
            incident_id=incident.id,
            adr_id=request.adr_id,
            target=request.target,
            requested_by=request.user_id,
            state=ChangeState.PENDING,
            approvals_needed=2 if request.two_person else 1,
            approved_by=[],
            change=dict(request.change),
            before=dict(request.before),
            after={"flags": dict(request.after_flags), "gateway": request.gateway_rules},
            result={},
            created_at=now,
            updated_at=now,
        )
        s.add(rem)
        s.flush()
        tokens = buttons.issue(
            s, buttons.subject(SUBJECT, rem.id), ("approve", "deny"),
            incident_id=incident.id, now=now, expires_at=expires,
        )  # fmt: skip
        detail = {
            "remediation": rem.id, "adr": request.adr_id, "target": request.target,
            "change": dict(request.change), "before": dict(request.before),
            "two_person": request.two_person, "expires_at": expires.isoformat(),
        }  # fmt: skip
        store.audit(
            s, at=now, actor=request.user_id, action="remediation.requested", incident=incident,
            detail=detail,
        )  # fmt: skip
        return rem, tokens

    async def get(self, remediation_id: int) -> Remediation:
        """One remediation (it must exist)."""

        def run() -> Remediation:
            with self._db.transaction() as s:
                rem = s.get(Remediation, remediation_id)
                assert rem is not None, remediation_id
                return rem

        return await asyncio.to_thread(run)

    async def clicked(self, value: str) -> tuple[ActionToken | None, Remediation | None]:
        """The button with this value and the remediation it belongs to (None for a button
        this bot did not issue, or one of another subject), in one read."""

        def run() -> tuple[ActionToken | None, Remediation | None]:
            with self._db.transaction() as s:
                row = buttons.find(s, value)
                key = buttons.subject_key(row.subject, SUBJECT) if row is not None else None
                return row, s.get(Remediation, int(key)) if key is not None else None

        return await asyncio.to_thread(run)

    async def tokens(self, subject: str) -> dict[str, str]:
        """The unused buttons of a subject, kind -> value."""

        def run() -> dict[str, str]:
            with self._db.transaction() as s:
                return buttons.live(s, subject)

        return await asyncio.to_thread(run)

    async def expires_at(self, subject: str) -> dt.datetime | None:
        """When a subject's buttons expire."""

        def run() -> dt.datetime | None:
            with self._db.transaction() as s:
                return buttons.expires_at(s, subject)

        return await asyncio.to_thread(run)

    async def pending_buttons(
        self, subject: str, *, tokens: dict[str, str] | None
    ) -> tuple[dict[str, str], dt.datetime | None]:
        """A pending card's buttons (``tokens`` when the caller has them) and when they expire,
        in one read."""

        def run() -> tuple[dict[str, str], dt.datetime | None]:
            with self._db.transaction() as s:
                live = buttons.live(s, subject) if tokens is None else tokens
                return live, buttons.expires_at(s, subject)

        return await asyncio.to_thread(run)

    async def claim(
        self,
        *,
        token: str,
        user_id: str,
        remediation_id: int,
        to_state: str,
        action: str,
        detail: Mapping[str, Any],
        from_state: str = ChangeState.PENDING,
        runner: str | None = None,
    ) -> Remediation | None:
        """Use a button: the remediation moves from ``from_state`` (a pending request, or a
        held change) to ``to_state`` and all its buttons are spent, with the audit entry, in
        one transaction; False when someone else was first, UsageError when the button expired
        (even after the caller's own check). ``runner``: the run that goes on with it."""

        def run() -> Remediation | None:
            now = self._clock()
            # The expiry is part of the conditional UPDATE: the caller checked it before a Slack
            # call (user groups), and the button may have expired in between.
            usable = buttons.usable(token, now)
            approvers = {}  # a request's approver; a held change keeps its own
            if from_state == ChangeState.PENDING:
                approved = to_state == ChangeState.APPROVED
                approvers = {"approved_by": [user_id] if approved else []}
            with self._db.transaction() as s:
                rem = _written(
                    s,
                    update(Remediation)
                    .where(
                        Remediation.id == remediation_id,
                        Remediation.state == from_state,
                        usable,
                    )
                    .values(
                        state=to_state,
                        updated_at=now,
                        heartbeat_at=db_now(),  # not started for long: its replica is gone
                        runner=runner,
                        **approvers,
                    ),
                )
                if rem is None:
                    _refuse_if_expired(s, token, now)
                    return None
                buttons.spend(s, buttons.subject(SUBJECT, remediation_id), user_id=user_id, now=now)
                return _audit(s, rem, now=now, actor=user_id, action=action,
                              detail={"token": token[:6], **detail})  # fmt: skip

        return self._moved(await asyncio.to_thread(run), action)

    async def step(
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
        canary: CanaryRecord | None = None,
        issue: Sequence[str] = (),
        issue_ttl_s: float | None = None,
        **fields: Any,
    ) -> Remediation | None:
        """Audit a step, then move the remediation to ``to_state`` (one transaction); False,
        changing nothing, unless it is in one of ``from_states``, run by ``owner`` and (with
        ``stale_s``) silent that long on the database's clock. ``canary``: a canary run the
        step follows, kept in the same transaction; ``issue``: buttons of these kinds for the
        card, usable for ``issue_ttl_s``. The remediation as the step wrote it."""

        def run() -> Remediation | None:
            now = self._clock()
            with self._db.transaction() as s:
                query = update(Remediation).where(Remediation.id == remediation_id)
                if from_states is not None:
                    query = query.where(Remediation.state.in_(list(from_states)))
                if owner is not None:
                    query = query.where(Remediation.runner == owner)
                if stale_s is not None:
                    query = query.where(rows.silent(stale_s))
                values = {"state": to_state, "updated_at": now, "heartbeat_at": db_now(), **fields}
                rem = _written(s, query.values(**values))
                if rem is None:
                    return None
                if canary is not None:  # the canary the step follows, kept with it
                    s.add(canary.row(incident_id=rem.incident_id, remediation_id=rem.id,
                                     at=now))  # fmt: skip
                if issue:
                    ttl = None if issue_ttl_s is None else dt.timedelta(seconds=issue_ttl_s)
                    buttons.issue(
                        s, buttons.subject(SUBJECT, rem.id), issue, incident_id=rem.incident_id,
                        now=now, expires_at=None if ttl is None else now + ttl,
                    )  # fmt: skip
                return _audit(s, rem, now=now, actor=actor, action=action,
                              detail={"state": to_state, **detail})  # fmt: skip

        return self._moved(await asyncio.to_thread(run), action)

    async def take(self, remediation_id: int, *, runner: str) -> Taken | None:
        """Become the run of an approved remediation nobody runs yet: the remediation and the
        newest change promoted on its target (what stands there), or None if another run has
        it."""

        def run() -> Taken | None:
            with self._db.transaction() as s:
                query = (
                    update(Remediation)
                    .where(
                        Remediation.id == remediation_id,
                        Remediation.state == ChangeState.APPROVED,
                        Remediation.runner.is_(None),
                    )
                    .values(runner=runner, heartbeat_at=db_now())
                )
                taken = _written(s, query)
                if taken is None:
                    return None
                return Taken(taken, store.promoted_change(s, target=taken.target))

        return await asyncio.to_thread(run)

    async def heartbeat(self, remediation_id: int, *, runner: str) -> bool:
        """Say the run is alive (on the database's clock); False when it is no longer this
        runner's, or no longer running."""

        def run() -> bool:
            with self._db.transaction() as s:
                return rows.beat(s, remediation_id, runner=runner)

        return await asyncio.to_thread(run)

    async def remember_card(self, remediation_id: int, *, channel: str, ts: str) -> None:
        """Where the card is, so every step updates that one message."""

        def run() -> None:
            with self._db.transaction() as s:
                s.execute(
                    update(Remediation)
                    .where(Remediation.id == remediation_id)
                    .values(channel=channel, ts=ts)
                )

        return await asyncio.to_thread(run)

    async def expired_pending(self) -> list[Remediation]:
        """Pending requests and held changes whose buttons have expired."""

        def run() -> list[Remediation]:
            now = self._clock()
            with self._db.transaction() as s:
                ids = {int(key) for key in buttons.expired_keys(s, SUBJECT, now)}
                if not ids:
                    return []
                query = select(Remediation).where(
                    Remediation.id.in_(ids),
                    Remediation.state.in_([ChangeState.PENDING, ChangeState.HELD]),
                )
                return list(s.scalars(query).all())

        return await asyncio.to_thread(run)

    async def note_silence(
        self, remediation_id: int, silence: Mapping[str, Any], *, action: str,
        detail: Mapping[str, Any],
    ) -> Remediation:  # fmt: skip
        """Keep the change's silence (created, failed, expired) with its audit entry, in one
        transaction; the state does not move. The remediation as it left it."""

        def run() -> Remediation:
            now = self._clock()
            with self._db.transaction() as s:
                rem = _written(
                    s,
                    update(Remediation)
                    .where(Remediation.id == remediation_id)
                    .values(silence=dict(silence)),
                )
                assert rem is not None, remediation_id
                return _audit(s, rem, now=now, actor="ruleloop", action=action,
                              detail=dict(detail))  # fmt: skip

        return await asyncio.to_thread(run)

    async def unexpired_silences(self) -> list[Remediation]:
        """Ended changes whose silence was not expired (their run died, or Alertmanager did
        not answer then)."""

        def run() -> list[Remediation]:
            with self._db.transaction() as s:
                query = select(Remediation).where(
                    Remediation.silence.is_not(None), Remediation.state.not_in(list(ACTIVE))
                )
                rows = s.scalars(query.order_by(Remediation.id)).all()
                return [r for r in rows if r.silence and r.silence.get("id") and
                        not r.silence.get("expired")]  # fmt: skip

        return await asyncio.to_thread(run)
