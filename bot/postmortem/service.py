"""The post-incident ADR draft in the thread: written from the store, reviewed with buttons.

When a remediation ends (and on `/adr-draft`), the incident's facts (alert, diagnosis, every
canary run, the applied fix) become a proposed ADR in the store (``adr_records``, with its
review buttons, in one transaction); its summary and Markdown file are posted in the thread
with Accept / Reject for the configured reviewers (never the author alone). Accepting changes
the record to accepted in one transaction: every replica matches and applies it at once. Of
two reviewers deciding at once, one wins; the other is told who did, and nothing changes.

This module is the flow; every read and write of the store is in ``bot.postmortem.records``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable

from bot.adr import Adr, SharedAdrStore
from bot.adr.render import render
from bot.change.gitops import publish_accepted
from bot.kernel import NotAllowed, Settings, UsageError
from bot.kernel.chat import MessageRef, mention
from bot.kernel.runtime import Members, who_may
from bot.kernel.store import AdrDraft, Database, subject_key
from bot.postmortem.ports import DraftNotifier, DraftView
from bot.postmortem.records import SUBJECT, AlreadyDecided, DraftRecords
from bot.postmortem.review import check_reviewer

__all__ = ["AlreadyDecided", "DraftService"]


class DraftService:
    """Drafts the post-incident ADR and handles its review buttons."""

    def __init__(
        self,
        *,
        settings: Settings,
        db: Database,
        adrs: SharedAdrStore,
        notifier: DraftNotifier,
        threads: Callable[[int, str | None], Awaitable[MessageRef]],
        clock: Callable[[], dt.datetime],
        members: Members | None = None,
    ) -> None:
        self.settings = settings
        self._members = members or Members(settings.access)
        self._notifier = notifier
        self._threads = threads
        self._adrs = adrs  # the bot's one ADR store (bot.app.server)
        self._records = DraftRecords(db=db, adrs=self._adrs, clock=clock)
        self._lock = asyncio.Lock()  # one id at a time in this process (the DB refuses twins)

    async def request(self, *, user_id: str, incident_id: int | None) -> str:
        """`/adr-draft`: who may diagnose or apply may draft; the summary goes to the thread."""
        access = self.settings.access
        expanded = await self._members()
        if not (expanded.allows("diagnose", user_id) or expanded.allows("apply", user_id)):
            raise NotAllowed(
                f"You may not draft ADRs. Allowed: {who_may(access.diagnose + access.apply)}."
            )
        chosen = incident_id if incident_id is not None else await self._records.newest_incident()
        adr_id = await self.draft(chosen, author=user_id)
        return f"Drafted {adr_id} for incident #{chosen}; it is in the incident's thread."

    async def after_change(self, incident_id: int, author: str, applied: Adr | None = None) -> None:
        """The draft a remediation ends with (the remediation service logs a failure);
        ``applied``: the ADR its run read, so the draft does not read it again."""
        await self.draft(incident_id, author=author, applied=applied)

    async def draft(self, incident_id: int, *, author: str, applied: Adr | None = None) -> str:
        """Store the draft with its review buttons, post it; its ADR id. ``applied``: the
        ADR of the incident's change where the caller has read it (else it is read here)."""
        async with self._lock:
            incident, canaries, fix = await self._records.facts(incident_id, applied=applied)
            adr, tokens, stored = await self._records.record(
                incident=incident,
                canaries=canaries,
                applied=fix,
                author=author,
            )
        return await self._post(incident_id, adr, tokens, stored)

    async def propose(
        self, incident_id: int, author: str, build: Callable[[str, dt.date], Adr]
    ) -> str:
        """Store a draft ``build`` makes (a re-tune's) with its review buttons, post it in
        the incident's thread; its ADR id."""
        async with self._lock:
            adr, tokens, stored = await self._records.record_built(
                incident_id, author=author, build=build
            )
        return await self._post(incident_id, adr, tokens, stored)

    async def _post(
        self, incident_id: int, adr: Adr, tokens: dict[str, str], stored: AdrDraft
    ) -> str:
        thread = await self._threads(incident_id, None)
        # the draft just built, where record() stored it: nothing to read back
        view = await self._view(adr.id, tokens=tokens, adr=adr, draft=stored)
        ref = await self._notifier.post_draft(
            thread, view=view, markdown=render(adr), filename=view.path.rsplit("/", 1)[-1]
        )
        await self._records.remember(adr.id, ref)
        return adr.id

    async def review(self, *, user_id: str, token: str) -> None:
        """Accept or Reject: reviewer checks, then the record, the draft and the buttons, once."""
        row = await self._records.token(token)
        adr_id = None if row is None else subject_key(row.subject, SUBJECT)
        if row is None or adr_id is None:
            raise UsageError("This button is not one this bot issued. Nothing was changed.")
        draft = await self._records.draft(adr_id)
        if row.used_at is not None or draft.state != "proposed":
            raise _already(draft, adr_id)
        reviewers = (await self._members()).review
        check_reviewer(reviewer=user_id, author=draft.author, reviewers=reviewers)
        try:
            state, where = await self._records.decide(adr_id, kind=row.kind, user_id=user_id)
        except AlreadyDecided:
            raise _already(await self._records.draft(adr_id), adr_id) from None
        if state == "accepted":
            note = f"It is now {where} in the store: every replica can apply it."
            # and, with [adr_publish], proposed to the team's repository (never raises)
            note += await publish_accepted(
                self.settings.adr_publish, self._adrs.row, adr_id, reviewer=user_id
            )
        else:
            note = f"Kept on record as {where} in the store."
        view = await self._view(adr_id, note=note)
        if draft.channel and draft.ts:
            await self._notifier.update_draft(
                MessageRef(channel=draft.channel, ts=draft.ts), view=view
            )

    async def _view(
        self, adr_id: str, *, tokens: dict[str, str] | None = None, note: str = "",
        adr: Adr | None = None, draft: AdrDraft | None = None,
    ) -> DraftView:  # fmt: skip
        """The draft's message; ``adr`` and ``draft``: the record and its draft row, where the
        caller holds them (else read)."""
        if draft is None:
            draft = await self._records.draft(adr_id)
        path = draft.path  # where the draft was stored (its export path)
        if adr is None:
            found = await asyncio.to_thread(self._adrs.find, adr_id)
            adr, path = (found[1], str(found[0])) if found else (None, path)
        return DraftView(
            adr_id=adr_id,
            title=adr.title if adr else adr_id,
            incident_id=draft.incident_id,
            path=path,
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
        f"{adr_id} was already {draft.state} by {mention(draft.reviewed_by)}{when}. "
        "Nothing was changed."
    )
