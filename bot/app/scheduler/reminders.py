"""One reminder per ADR draft nobody reviewed: a reply in its incident's thread, naming reviewers.

A draft is due when it is still ``proposed``, was posted more than ``after_s`` ago and was never
reminded about. The reply is posted first and ``reminded_at`` set after, each draft on its own:
a replica that dies in between leaves that draft due, and the replica that takes the period
over reminds about it (at worst one reminder twice, never none).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from dataclasses import dataclass

from bot.app.scheduler import messages
from bot.app.scheduler.runner import JobOutcome
from bot.kernel.chat import MessageRef, Notifier
from bot.kernel.runtime import who_may
from bot.kernel.store import Database
from bot.kernel.store import service as store

log = logging.getLogger("ruleloop.scheduler")


@dataclass(frozen=True)
class Due:
    """A draft to remind about, and its incident's thread (None: the thread is gone)."""

    id: int
    incident_id: int
    adr_id: str
    path: str
    created_at: dt.datetime
    thread: MessageRef | None


class DraftReminders:
    """The draft-reminder job: ``await job(now)`` reminds about every due draft once."""

    def __init__(
        self, *, db: Database, notifier: Notifier, after_s: float, reviewers: list[str]
    ) -> None:
        self._db = db
        self._notifier = notifier
        self._after = dt.timedelta(seconds=after_s)
        self._reviewers = reviewers

    async def __call__(self, now: dt.datetime) -> JobOutcome:
        """Post one reminder per due draft, then record it."""
        reminded, threadless = [], []
        for draft in await asyncio.to_thread(self.due, now):
            if draft.thread is None:
                threadless.append(draft.adr_id)
            else:
                text = messages.DRAFT_REMINDER.format(
                    adr=draft.adr_id,
                    age=messages.age_text((now - draft.created_at).total_seconds()),
                    path=draft.path,
                    reviewers=who_may(self._reviewers),
                )
                await self._notifier.post_reply(draft.thread, text=text)
                reminded.append(draft.adr_id)
            await asyncio.to_thread(self._record, draft, now)
        if threadless:
            log.warning("drafts with no incident thread to remind in: %s", threadless)
        return JobOutcome({"reminded": reminded, "no_thread": threadless})

    def due(self, now: dt.datetime) -> list[Due]:
        """Drafts to remind about now."""
        with self._db.transaction() as s:
            due = []
            for draft in store.drafts_to_remind(s, created_before=now - self._after):
                incident = store.get(s, draft.incident_id)
                root = None if incident is None else store.root_message(s, incident)
                thread = None if root is None else MessageRef(root.channel, root.ts)
                due.append(Due(draft.id, draft.incident_id, draft.adr_id, draft.path,
                               draft.created_at, thread))  # fmt: skip
            return due

    def _record(self, draft: Due, now: dt.datetime) -> None:
        with self._db.transaction() as s:
            if store.mark_reminded(s, draft_id=draft.id, at=now):
                incident = store.get(s, draft.incident_id)
                store.audit(
                    s,
                    at=now,
                    actor="ruleloop",
                    action="adr.draft_reminded",
                    incident=incident,
                    detail={"adr": draft.adr_id, "posted": draft.thread is not None},
                )
