"""The post-incident ADR draft in the thread: written from the store, reviewed with buttons.

When a remediation ends (and on `/adr-draft`), the incident's facts (alert, diagnosis, every
canary run, the applied fix) become a proposed ADR in ``adr/drafts/``; its summary and file are
posted in the thread with Accept / Reject for the configured reviewers (never the author alone).
Accepting moves it to ``adr/`` as accepted: the next incident can apply it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable

from sqlalchemy import select, update

from bot.adr.models import Adr, AdrGates
from bot.adr.store import AdrStore
from bot.config import AccessSettings, Settings
from bot.diagnosis.ports import MessageRef
from bot.errors import NotAllowed, UsageError
from bot.postmortem.draft import AppliedFix, CanaryFacts, IncidentFacts, build_postmortem
from bot.postmortem.review import accept_draft, check_reviewer, reject_draft
from bot.remediation.policy import who_may
from bot.remediation.ports import DraftView, RemediationNotifier
from bot.remediation.records import new_token
from bot.store import service as store
from bot.store.db import Database
from bot.store.models import ActionToken, AdrDraft, CanaryResult, Incident, Remediation

ENDED = ("promoted", "rolled_back", "failed")


class DraftService:
    """Drafts the post-incident ADR and handles its review buttons."""

    def __init__(
        self,
        *,
        settings: Settings,
        db: Database,
        notifier: RemediationNotifier,
        threads: Callable[[int, str | None], Awaitable[MessageRef]],
        clock: Callable[[], dt.datetime],
        members: Callable[[], Awaitable[AccessSettings]] | None = None,
    ) -> None:
        self.settings = settings
        self._members = members
        self._db = db
        self._notifier = notifier
        self._threads = threads
        self._clock = clock
        self._adrs = AdrStore(root=settings.paths.adr)
        self._lock = asyncio.Lock()  # one id at a time in this process (the DB refuses twins)

    async def request(self, *, user_id: str, incident_id: int | None) -> str:
        """`/adr-draft`: who may diagnose or apply may draft; the summary goes to the thread."""
        access = self.settings.access
        expanded = await self._expanded()
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

    async def _expanded(self) -> AccessSettings:
        return self.settings.access if self._members is None else await self._members()

    def _newest_incident(self) -> int:
        with self._db.transaction() as s:
            found = s.scalars(select(Incident.id).order_by(Incident.id.desc())).first()
        if found is None:
            raise UsageError("there is no incident to draft an ADR for yet")
        return found

    async def draft(self, incident_id: int, *, author: str) -> str:
        """Write the draft, record it with its review buttons, post it; its ADR id."""
        async with self._lock:
            incident, canaries, applied = await asyncio.to_thread(self._facts, incident_id)
            now = self._clock()
            adr_id = await asyncio.to_thread(self._adrs.next_id, now.date())
            adr = build_postmortem(
                adr_id=adr_id,
                day=now.date(),
                incident=incident,
                canaries=canaries,
                applied=applied,
                deciders=[author],
            )
            path = await asyncio.to_thread(self._adrs.write_draft, adr)
            tokens = await asyncio.to_thread(
                self._record, adr_id=adr_id, incident_id=incident_id, path=str(path), author=author
            )
        thread = await self._threads(incident_id, None)
        view = await asyncio.to_thread(self._view, adr_id, tokens=tokens)
        ref = await self._notifier.post_draft(
            thread, view=view, markdown=path.read_text(encoding="utf-8"), filename=path.name
        )
        await asyncio.to_thread(self._remember, adr_id, ref)
        return adr_id

    async def review(self, *, user_id: str, token: str) -> None:
        """Accept or Reject: reviewer checks, the file move, then the record, once."""
        row = await asyncio.to_thread(self._token, token)
        if row is None or not row.subject.startswith("draft:"):
            raise UsageError("This button is not one this bot issued. Nothing was changed.")
        if row.used_at is not None:
            raise UsageError(
                f"This draft was already reviewed by <@{row.used_by}>. Nothing was changed."
            )
        adr_id = row.subject.split(":", 1)[1]
        draft = await asyncio.to_thread(self._draft, adr_id)
        reviewers = (await self._expanded()).review
        check_reviewer(reviewer=user_id, author=draft.author, reviewers=reviewers)
        today = self._clock().date()
        if row.kind == "accept":
            path = await asyncio.to_thread(
                accept_draft, self._adrs, adr_id, reviewer=user_id, day=today
            )
            state, note = "accepted", f"It is now {path.name} under adr/ and can be applied."
        else:
            path = await asyncio.to_thread(
                reject_draft, self._adrs, adr_id, reviewer=user_id, day=today,
                reason=f"rejected in Slack by {user_id}",
            )  # fmt: skip
            state, note = "rejected", f"Kept on record as {path.name}."
        await asyncio.to_thread(self._decided, adr_id, state=state, user_id=user_id, path=path)
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

    def _record(self, *, adr_id: str, incident_id: int, path: str, author: str) -> dict[str, str]:
        now = self._clock()
        tokens = {kind: new_token() for kind in ("accept", "reject")}
        with self._db.transaction() as s:
            s.add(
                AdrDraft(
                    adr_id=adr_id, incident_id=incident_id, path=path, author=author,
                    state="proposed", created_at=now,
                )
            )  # fmt: skip
            for kind, token in tokens.items():
                s.add(
                    ActionToken(
                        token=token, kind=kind, subject=f"draft:{adr_id}",
                        incident_id=incident_id, created_at=now,
                    )
                )  # fmt: skip
            store.audit(
                s, at=now, actor=author, action="adr_draft.written",
                incident=store.get(s, incident_id), detail={"adr": adr_id, "path": path},
            )  # fmt: skip
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

    def _decided(self, adr_id: str, *, state: str, user_id: str, path: object) -> None:
        now = self._clock()
        with self._db.transaction() as s:
            s.execute(
                update(AdrDraft)
                .where(AdrDraft.adr_id == adr_id)
                .values(state=state, reviewed_at=now, reviewed_by=user_id)
            )
            s.execute(
                update(ActionToken)
                .where(ActionToken.subject == f"draft:{adr_id}", ActionToken.used_at.is_(None))
                .values(used_at=now, used_by=user_id)
            )
            draft = s.scalars(select(AdrDraft).where(AdrDraft.adr_id == adr_id)).one()
            store.audit(
                s, at=now, actor=user_id, action=f"adr_draft.{state}",
                incident=store.get(s, draft.incident_id), detail={"adr": adr_id, "path": str(path)},
            )  # fmt: skip

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


def _as_judged(adr: Adr, limits: dict[str, float] | None) -> Adr:
    """The ADR with the gates its canary was judged by: 'Nx normal' as the numbers it meant."""
    if adr.gates is None or not adr.gates.relative():
        return adr
    # Resolved when the remediation ran; a run that ended before that keeps only numbers.
    gates = AdrGates(**limits) if limits is not None else adr.gates.resolve({}, strict=False)
    return adr.model_copy(update={"gates": gates})
