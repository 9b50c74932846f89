"""The post-incident ADR draft in the thread: written from the store, reviewed with buttons.

When a remediation ends (and on `/adr-draft`), the incident's facts (alert, diagnosis, every
canary run, the applied fix) become a proposed ADR in the store (``adr_records``, with its
review buttons, in one transaction); its summary and Markdown file are posted in the thread
with Accept / Reject for the configured reviewers (never the author alone). Accepting changes
the record to accepted in one transaction: every replica matches and applies it at once. Of
two reviewers deciding at once, one wins; the other is told who did, and nothing changes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any, cast

from sqlalchemy import select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from bot.adr.models import Adr, AdrGates, Status
from bot.adr.render import render
from bot.adr.shared import SharedAdrStore
from bot.chat.messages import MessageRef
from bot.config import Settings
from bot.errors import NotAllowed, UsageError
from bot.postmortem.draft import AppliedFix, CanaryFacts, IncidentFacts, build_postmortem
from bot.postmortem.ports import DraftNotifier, DraftView
from bot.postmortem.review import check_reviewer, decided, rejection_note
from bot.runtime.access import Members, who_may
from bot.runtime.ids import new_token
from bot.store import adrs as records
from bot.store import service as store
from bot.store.db import Database
from bot.store.models import ActionToken, AdrDraft, CanaryResult, Incident, Remediation

ENDED = ("promoted", "rolled_back", "failed")
ID_TRIES = 5  # replicas drafting on one day at once: each takes the next free id


class AlreadyDecided(UsageError):
    """Someone decided the draft first; nothing was changed."""


class DraftService:
    """Drafts the post-incident ADR and handles its review buttons."""

    def __init__(
        self,
        *,
        settings: Settings,
        db: Database,
        notifier: DraftNotifier,
        threads: Callable[[int, str | None], Awaitable[MessageRef]],
        clock: Callable[[], dt.datetime],
        members: Members | None = None,
    ) -> None:
        self.settings = settings
        self._members = members or Members(settings.access)
        self._db = db
        self._notifier = notifier
        self._threads = threads
        self._clock = clock
        self._adrs = SharedAdrStore(root=settings.paths.adr, db=db, clock=clock)
        self._lock = asyncio.Lock()  # one id at a time in this process (the DB refuses twins)

    async def request(self, *, user_id: str, incident_id: int | None) -> str:
        """`/adr-draft`: who may diagnose or apply may draft; the summary goes to the thread."""
        access = self.settings.access
        expanded = await self._members()
        if not (expanded.allows("diagnose", user_id) or expanded.allows("apply", user_id)):
            raise NotAllowed(
                f"You may not draft ADRs. Allowed: {who_may(access.diagnose + access.apply)}."
            )
        chosen = (
            incident_id
            if incident_id is not None
            else await asyncio.to_thread(self._newest_incident)
        )
        adr_id = await self.draft(chosen, author=user_id)
        return f"Drafted {adr_id} for incident #{chosen}; it is in the incident's thread."

    def _newest_incident(self) -> int:
        with self._db.transaction() as s:
            found = s.scalars(select(Incident.id).order_by(Incident.id.desc())).first()
        if found is None:
            raise UsageError("there is no incident to draft an ADR for yet")
        return found

    async def after_change(self, incident_id: int, author: str) -> None:
        """The draft a remediation ends with (the remediation service logs a failure)."""
        await self.draft(incident_id, author=author)

    async def draft(self, incident_id: int, *, author: str) -> str:
        """Store the draft with its review buttons, post it; its ADR id."""
        async with self._lock:
            incident, canaries, applied = await asyncio.to_thread(self._facts, incident_id)
            adr, tokens = await asyncio.to_thread(
                self._record, incident=incident, canaries=canaries, applied=applied, author=author
            )
        thread = await self._threads(incident_id, None)
        view = await asyncio.to_thread(self._view, adr.id, tokens=tokens)
        ref = await self._notifier.post_draft(
            thread, view=view, markdown=render(adr), filename=view.path.rsplit("/", 1)[-1]
        )
        await asyncio.to_thread(self._remember, adr.id, ref)
        return adr.id

    async def review(self, *, user_id: str, token: str) -> None:
        """Accept or Reject: reviewer checks, then the record, the draft and the buttons, once."""
        row = await asyncio.to_thread(self._token, token)
        if row is None or not row.subject.startswith("draft:"):
            raise UsageError("This button is not one this bot issued. Nothing was changed.")
        adr_id = row.subject.split(":", 1)[1]
        draft = await asyncio.to_thread(self._draft, adr_id)
        if row.used_at is not None or draft.state != "proposed":
            raise _already(draft, adr_id)
        reviewers = (await self._members()).review
        check_reviewer(reviewer=user_id, author=draft.author, reviewers=reviewers)
        try:
            state, where = await asyncio.to_thread(
                self._decide, adr_id, kind=row.kind, user_id=user_id
            )
        except AlreadyDecided:
            raise _already(await asyncio.to_thread(self._draft, adr_id), adr_id) from None
        if state == "accepted":
            note = f"It is now {where} in the store: every replica can apply it."
        else:
            note = f"Kept on record as {where} in the store."
        view = await asyncio.to_thread(self._view, adr_id, note=note)
        if draft.channel and draft.ts:
            await self._notifier.update_draft(
                MessageRef(channel=draft.channel, ts=draft.ts), view=view
            )

    # --- store ----------------------------------------------------------------------------
    def _facts(
        self, incident_id: int
    ) -> tuple[IncidentFacts, list[CanaryFacts], AppliedFix | None]:
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
                diagnosis=incident.summary or None,
            )
            rows = s.scalars(
                select(CanaryResult)
                .where(CanaryResult.incident_id == incident_id)
                .order_by(CanaryResult.id)
            ).all()
            canaries = [
                CanaryFacts.from_report(label=r.label, report=r.report, at=r.at) for r in rows
            ]
            rem = s.scalars(
                select(Remediation)
                .where(Remediation.incident_id == incident_id, Remediation.state.in_(ENDED))
                .order_by(Remediation.id.desc())
            ).first()
        applied = None
        if rem is not None:
            found = self._adrs.find(rem.adr_id)
            if found is not None:
                applied = AppliedFix(
                    adr=_as_judged(found[1], rem.result.get("gates")),
                    state=rem.state,
                    before_flags=rem.before.get("flags", {}),
                    after_flags=rem.after.get("flags", {}),
                    requested_by=rem.requested_by,
                    approved_by=list(rem.approved_by),
                    failed_gates=list(rem.result.get("failures", [])),
                )
        return facts, canaries, applied

    def _record(
        self, *, incident: IncidentFacts, canaries: list[CanaryFacts],
        applied: AppliedFix | None, author: str,
    ) -> tuple[Adr, dict[str, str]]:  # fmt: skip
        """The draft, its review buttons and its audit entry, in one transaction.

        Another replica may take the same id at the same moment: the store refuses the second
        (unique id) and the draft is built again with the next free id.
        """
        self._adrs.sync()  # ids of files added to adr/ count too
        for attempt in range(ID_TRIES):
            now = self._clock()
            try:
                with self._db.transaction() as s:
                    adr = build_postmortem(
                        adr_id=self._adrs.free_id(s, now.date()), day=now.date(),
                        incident=incident, canaries=canaries, applied=applied, deciders=[author],
                    )  # fmt: skip
                    tokens = self._insert(s, adr, incident_id=incident.id, author=author, now=now)
                return adr, tokens
            except IntegrityError:
                if attempt == ID_TRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _insert(
        self, s: Session, adr: Adr, *, incident_id: int, author: str, now: dt.datetime
    ) -> dict[str, str]:
        stored = self._adrs.add_draft(s, adr, source="bot", actor=author, at=now)
        path = str(self._adrs.location(stored))
        tokens = {kind: new_token() for kind in ("accept", "reject")}
        s.add(
            AdrDraft(
                adr_id=adr.id, incident_id=incident_id, path=path, author=author,
                state="proposed", created_at=now,
            )
        )  # fmt: skip
        for kind, token in tokens.items():
            s.add(
                ActionToken(
                    token=token, kind=kind, subject=f"draft:{adr.id}",
                    incident_id=incident_id, created_at=now,
                )
            )  # fmt: skip
        store.audit(
            s, at=now, actor=author, action="adr_draft.written",
            incident=store.get(s, incident_id), detail={"adr": adr.id, "path": path},
        )  # fmt: skip
        s.flush()  # a taken id fails here, inside the retry
        return tokens

    def _remember(self, adr_id: str, ref: MessageRef) -> None:
        with self._db.transaction() as s:
            s.execute(
                update(AdrDraft)
                .where(AdrDraft.adr_id == adr_id)
                .values(channel=ref.channel, ts=ref.ts)
            )

    def _token(self, value: str) -> ActionToken | None:
        with self._db.transaction() as s:
            return s.scalars(select(ActionToken).where(ActionToken.token == value)).one_or_none()

    def _draft(self, adr_id: str) -> AdrDraft:
        with self._db.transaction() as s:
            draft = s.scalars(select(AdrDraft).where(AdrDraft.adr_id == adr_id)).one_or_none()
        if draft is None:
            raise UsageError(f"{adr_id} is not a draft this bot posted")
        return draft

    def _decide(self, adr_id: str, *, kind: str, user_id: str) -> tuple[str, str]:
        """Decide the draft in one transaction: the record's new version, the draft's state,
        its buttons and the audit entry; AlreadyDecided when another reviewer was first."""
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
            s.execute(
                update(ActionToken)
                .where(ActionToken.subject == f"draft:{adr_id}", ActionToken.used_at.is_(None))
                .values(used_at=now, used_by=user_id)
            )
            draft = s.scalars(select(AdrDraft).where(AdrDraft.adr_id == adr_id)).one()
            draft.path = where
            store.audit(
                s, at=now, actor=user_id, action=f"adr_draft.{state}",
                incident=store.get(s, draft.incident_id),
                detail={"adr": adr_id, "path": where, "version": changed.version},
            )  # fmt: skip
        return state, where

    def _view(
        self, adr_id: str, *, tokens: dict[str, str] | None = None, note: str = ""
    ) -> DraftView:
        draft = self._draft(adr_id)
        found = self._adrs.find(adr_id)
        adr = found[1] if found else None
        return DraftView(
            adr_id=adr_id,
            title=adr.title if adr else adr_id,
            incident_id=draft.incident_id,
            path=str(found[0]) if found else draft.path,
            state=draft.state,
            matrix=[row.model_dump() for row in adr.matrix] if adr else [],
            reviewers=list(self.settings.access.review),
            author=draft.author,
            tokens=tokens or {},
            reviewed_by=draft.reviewed_by,
            note=note,
        )


def _already(draft: AdrDraft, adr_id: str) -> UsageError:
    """What the reviewer who came second is told."""
    if draft.state == "proposed":  # the buttons were used, the draft not decided: a stale click
        return UsageError(f"These buttons of {adr_id} were already used. Nothing was changed.")
    when = f" at {draft.reviewed_at:%H:%M} UTC" if draft.reviewed_at else ""
    return AlreadyDecided(
        f"{adr_id} was already {draft.state} by <@{draft.reviewed_by}>{when}. Nothing was changed."
    )


def _as_judged(adr: Adr, limits: dict[str, float] | None) -> Adr:
    """The ADR with the gates its canary was judged by: 'Nx normal' as the numbers it meant."""
    if adr.gates is None or not adr.gates.relative():
        return adr
    # Resolved when the remediation ran; a run that ended before that keeps only numbers.
    gates = AdrGates(**limits) if limits is not None else adr.gates.resolve({}, strict=False)
    return adr.model_copy(update={"gates": gates})
