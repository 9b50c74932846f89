"""Store operations of the post-incident draft, each one transaction (run them in a thread).

The facts a draft is written from (the incident, its canary runs, the fix applied); the draft
with its review buttons and audit entry; the decision of a review. A decision is a conditional
update (``WHERE state = 'proposed'``): of two reviewers deciding at once exactly one wins, the
other gets ``AlreadyDecided`` and nothing changes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable
from typing import Any, cast

from pydantic import ValidationError
from sqlalchemy import Select, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from bot.adr import BEFORE, NORMAL, Adr, AdrGates, SharedAdrStore, Status
from bot.adr.render import render
from bot.adr.workload import WorkloadShape
from bot.canary import judged_limits
from bot.kernel import UsageError
from bot.kernel.chat import MessageRef
from bot.kernel.store import AdrDraft, ChangeState, Database, Incident, Remediation, buttons
from bot.kernel.store import adrs as records
from bot.kernel.store import service as store
from bot.postmortem.draft import AppliedFix, CanaryFacts, IncidentFacts, build_postmortem
from bot.postmortem.review import decided, rejection_note

log = logging.getLogger(__name__)

SUBJECT = "draft"  # its review buttons' subject: buttons.subject(SUBJECT, adr_id)
# the remediations that ran their course (kept, rolled back, or failed): the fix a draft reports
ENDED = (ChangeState.PROMOTED, ChangeState.ROLLED_BACK, ChangeState.FAILED)
ID_TRIES = 5  # replicas drafting on one day at once: each takes the next free id


class AlreadyDecided(UsageError):
    """Someone decided the draft first; nothing was changed."""


class DraftRecords(buttons.ButtonReads):
    """Drafts, their review buttons and the facts they are written from, on one database."""

    def __init__(
        self, *, db: Database, adrs: SharedAdrStore, clock: Callable[[], dt.datetime]
    ) -> None:
        self._db = db
        self._adrs = adrs
        self._clock = clock

    async def newest_incident(self) -> int:
        """The newest incident's id; UsageError when there is none."""

        def run() -> int:
            with self._db.transaction() as s:
                found = s.scalars(select(Incident.id).order_by(Incident.id.desc())).first()
            if found is None:
                raise UsageError("there is no incident to draft an ADR for yet")
            return found

        return await asyncio.to_thread(run)

    async def facts(
        self, incident_id: int, *, applied: Adr | None = None
    ) -> tuple[IncidentFacts, list[CanaryFacts], AppliedFix | None]:
        """What the draft is written from: the incident, its canary runs, the fix it ended with.
        ``applied``: that fix's ADR where the caller read it already (read here otherwise)."""

        def run() -> tuple[IncidentFacts, list[CanaryFacts], AppliedFix | None]:
            with self._db.transaction() as s:
                incident = store.get(s, incident_id)
                if incident is None:
                    raise UsageError(f"there is no incident {incident_id}")
                annotations = [
                    str(a.annotations.get(key))
                    for a in incident.alerts
                    for key in ("summary", "description")
                    if a.annotations.get(key)
                ]
                facts = IncidentFacts(
                    id=incident.id,
                    title=incident.title,
                    target=incident.target,
                    opened_at=incident.opened_at,
                    closed_at=incident.closed_at,
                    labels={k: str(v) for k, v in incident.labels.items()},
                    annotations=annotations,
                    diagnosis=incident.summary,
                )
                canaries = [
                    CanaryFacts.from_report(label=r.label, report=r.report, at=r.at)
                    for r in store.canary_results(s, incident_id)
                ]
                rem = s.scalars(
                    select(Remediation)
                    .where(Remediation.incident_id == incident_id, Remediation.state.in_(ENDED))
                    .order_by(Remediation.id.desc())
                ).first()
            fix = None
            if rem is not None:
                adr = _adr_of(rem, applied, self._adrs)
                if adr is not None:
                    fix = AppliedFix(
                        adr=_as_judged(adr, rem.result.get("gates")),
                        state=rem.state,
                        before_flags=rem.before.get("flags", {}),
                        after_flags=rem.after.get("flags", {}),
                        requested_by=rem.requested_by,
                        approved_by=list(rem.approved_by),
                        failed_gates=list(rem.result.get("failures", [])),
                        limits=dict(rem.result.get("gates") or {}),
                        shape=_shape(rem.result.get("workload_shape"), remediation_id=rem.id),
                        how_sure=[str(s) for s in rem.result.get("how_sure", [])],
                        watched=[str(w) for w in rem.result.get("watched", [])],
                    )
            return facts, canaries, fix

        return await asyncio.to_thread(run)

    async def record(
        self, *, incident: IncidentFacts, canaries: list[CanaryFacts],
        applied: AppliedFix | None, author: str,
    ) -> tuple[Adr, dict[str, str], AdrDraft]:  # fmt: skip
        """The draft, its review buttons and its audit entry, in one transaction; the draft,
        its buttons and its row as written.

        Another replica may take the same id at the same moment: the store refuses the second
        (unique id) and the draft is built again with the next free id.
        """

        def build(adr_id: str, day: dt.date) -> Adr:
            return build_postmortem(
                adr_id=adr_id, day=day, incident=incident, canaries=canaries, applied=applied,
                deciders=[author],
            )  # fmt: skip

        return await self.record_built(incident.id, author=author, build=build)

    async def record_built(
        self, incident_id: int, *, author: str, build: Callable[[str, dt.date], Adr]
    ) -> tuple[Adr, dict[str, str], AdrDraft]:
        """``record`` of a draft ``build`` makes once its id and day are known (a re-tune's)."""

        def run() -> tuple[Adr, dict[str, str], AdrDraft]:
            self._adrs.sync()  # ids of files added to adr/ count too
            for attempt in range(ID_TRIES):
                now = self._clock()
                try:
                    with self._db.transaction() as s:
                        adr = build(self._adrs.free_id(s, now.date()), now.date())
                        tokens, row = self._insert(
                            s, adr, incident_id=incident_id, author=author, now=now
                        )
                    return adr, tokens, row
                except IntegrityError:
                    if attempt == ID_TRIES - 1:
                        raise
            raise AssertionError("unreachable")

        return await asyncio.to_thread(run)

    def _insert(
        self, s: Session, adr: Adr, *, incident_id: int, author: str, now: dt.datetime
    ) -> tuple[dict[str, str], AdrDraft]:
        stored = self._adrs.add_draft(s, adr, source="bot", actor=author, at=now)
        path = str(self._adrs.location(stored))
        row = AdrDraft(
            adr_id=adr.id, incident_id=incident_id, path=path, author=author,
            state="proposed", created_at=now,
        )  # fmt: skip
        s.add(row)
        tokens = buttons.issue(
            s, buttons.subject(SUBJECT, adr.id), ("accept", "reject"),
            incident_id=incident_id, now=now,
        )  # fmt: skip
        store.audit(
            s, at=now, actor=author, action="adr_draft.written",
            incident=store.get(s, incident_id), detail={"adr": adr.id, "path": path},
        )  # fmt: skip
        s.flush()  # a taken id fails here, inside the retry
        return tokens, row

    async def remember(self, adr_id: str, ref: MessageRef) -> None:
        """Where the draft's summary was posted (to update it after review)."""

        def run() -> None:
            with self._db.transaction() as s:
                s.execute(
                    update(AdrDraft)
                    .where(AdrDraft.adr_id == adr_id)
                    .values(channel=ref.channel, ts=ref.ts)
                )

        return await asyncio.to_thread(run)

    async def draft(self, adr_id: str) -> AdrDraft:
        """The draft (detached); UsageError when this bot posted none of that id."""

        def run() -> AdrDraft:
            with self._db.transaction() as s:
                draft = s.scalars(_draft(adr_id)).one_or_none()
            if draft is None:
                raise UsageError(f"{adr_id} is not a draft this bot posted")
            return draft

        return await asyncio.to_thread(run)

    async def decide(self, adr_id: str, *, kind: str, user_id: str) -> tuple[str, str]:
        """Decide the draft in one transaction: the record's new version, the draft's state,
        its buttons and the audit entry; AlreadyDecided when another reviewer was first."""

        def run() -> tuple[str, str]:
            now = self._clock()
            state: Status = "accepted" if kind == "accept" else "rejected"
            reason = f"rejected in Slack by {user_id}"
            with self._db.transaction() as s:
                # Claim the draft first: a reviewer whose transaction starts after the winner's
                # committed (SQLite serializes them) must be told who won, not that the record
                # is no longer a proposal.
                won = s.execute(
                    update(AdrDraft)
                    .where(AdrDraft.adr_id == adr_id, AdrDraft.state == "proposed")
                    .values(state=state, reviewed_at=now, reviewed_by=user_id)
                )
                if cast(CursorResult[Any], won).rowcount != 1:  # another reviewer was first
                    raise AlreadyDecided(adr_id)
                row = records.get(s, adr_id)
                if row is None:
                    raise UsageError(f"{adr_id} is not in the store any more. Nothing was changed.")
                note = (
                    f"accepted by {user_id}."
                    if state == "accepted"
                    else rejection_note(adr_id, reviewer=user_id, reason=reason)
                )
                record = decided(
                    self._adrs.parsed(row), status=state, reviewer=user_id, note=note,
                    day=now.date(), name=row.name,
                )  # fmt: skip
                changed = records.change(
                    s, row, name=row.name, draft=False, status=state, markdown=render(record),
                    source="slack", actor=user_id, at=now, note=f"{state} in Slack by {user_id}",
                    synced=False,
                )  # fmt: skip
                if changed is None:
                    raise AlreadyDecided(adr_id)
                where = str(self._adrs.location(changed))
                buttons.spend(s, buttons.subject(SUBJECT, adr_id), user_id=user_id, now=now)
                draft = s.scalars(_draft(adr_id)).one()
                draft.path = where
                store.audit(
                    s, at=now, actor=user_id, action=f"adr_draft.{state}",
                    incident=store.get(s, draft.incident_id),
                    detail={"adr": adr_id, "path": where, "version": changed.version},
                )  # fmt: skip
            return state, where

        return await asyncio.to_thread(run)


def _adr_of(rem: Remediation, read: Adr | None, adrs: SharedAdrStore) -> Adr | None:
    """The change's ADR: the one its run read, else the store's (None when it is gone)."""
    if read is not None and read.id == rem.adr_id:
        return read
    found = adrs.find(rem.adr_id)
    return found[1] if found else None


def _as_judged(adr: Adr, limits: dict[str, float] | None) -> Adr:
    """The ADR with the gates its canary was judged by: 'Nx normal' as the numbers it meant.

    'Nx before' stays as written: the next change measures its own before-run, on any machine.
    """
    if adr.gates is None or not adr.gates.relative(NORMAL):
        return adr
    # Resolved when the remediation ran; a run that ended before that keeps only numbers.
    judged = {**judged_limits(adr.gates, limits).limits(), **adr.gates.relative(BEFORE)}
    gates = AdrGates.model_validate({**judged, "confidence": adr.gates.confidence})
    return adr.model_copy(update={"gates": gates})


def _shape(data: object, *, remediation_id: int) -> WorkloadShape | None:
    """The workload shape the remediation's judging canary sent (stored as JSON beside its
    numbers); None when it recorded none, or one this version cannot read (the draft is still
    written, without ``workload:``)."""
    if data is None:
        return None
    try:
        return WorkloadShape.model_validate(data)
    except ValidationError as exc:
        log.warning("remediation %s: its canary's workload shape is unreadable: %s",
                    remediation_id, exc.errors()[0]["msg"])  # fmt: skip
        return None


def _draft(adr_id: str) -> Select[AdrDraft]:
    return select(AdrDraft).where(AdrDraft.adr_id == adr_id)
