"""The incident records the flows read and write, as awaitables (store work runs in threads)."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session

from bot.incidents import memory
from bot.kernel import UsageError
from bot.kernel.chat import CAUSE, CAUSE_CONFIRMED, CAUSE_WRONG, IncidentView, MessageRef
from bot.kernel.store import Database, DiagnosisSummary, Incident, buttons
from bot.kernel.store import outbox as items
from bot.kernel.store import service as store

# an incident's thread buttons: which kinds it gets, and their message once they have tokens
ButtonsOf = tuple[Callable[[Incident], Sequence[str]], Callable[[dict[str, str]], dict[str, Any]]]


def _owe_buttons(
    s: Session, incident: Incident, buttons_of: ButtonsOf, *, now: dt.datetime
) -> None:
    """Issue the incident's thread buttons (each kind its own subject: pressing one leaves the
    others usable, except the cause pair, which one press spends; they do not expire) and owe
    their message, once per incident."""
    kinds, render = buttons_of
    wanted = list(kinds(incident))
    if not wanted or items.find(s, incident.id, "buttons") is not None:
        return
    tokens: dict[str, str] = {}
    pair = [kind for kind in wanted if kind in (CAUSE_CONFIRMED, CAUSE_WRONG)]
    for kind in wanted:
        if kind not in pair:
            tokens |= buttons.issue(
                s, buttons.subject(kind, incident.id), [kind], incident_id=incident.id, now=now
            )
    if pair:
        tokens |= buttons.issue(
            s, buttons.subject(CAUSE, incident.id), pair, incident_id=incident.id, now=now
        )
    items.owe(s, incident.id, kind=items.REPLY, key="buttons", at=now, payload=render(tokens))


class IncidentRecords:
    """One database and clock; each method is one transaction."""

    def __init__(self, *, db: Database, clock: Callable[[], dt.datetime]) -> None:
        self._db = db
        self._clock = clock

    async def load(self, incident_id: int) -> Incident:
        """The incident (detached); UsageError when there is none."""

        def read() -> Incident:
            with self._db.transaction() as s:
                incident = store.get(s, incident_id)
                if incident is None:
                    raise UsageError(f"no incident {incident_id}")
                return incident

        return await asyncio.to_thread(read)

    async def view(self, incident_id: int, state: str | None = None) -> IncidentView:
        """What the root message shows now (``state`` unset: as the store says it stands)."""

        def read() -> tuple[Incident, str]:
            with self._db.transaction() as s:
                incident = store.get(s, incident_id)
                if incident is None:
                    raise UsageError(f"no incident {incident_id}")
                return incident, state or items.display_state(s, incident)

        i, shown = await asyncio.to_thread(read)
        requested_by = i.labels.get("requested_by") if i.source == "slash" else None
        return IncidentView(
            **store.head(i), state=shown, requested_by=requested_by,
            acknowledged_by=i.acknowledged_by,
        )  # fmt: skip

    async def alert_start(self, incident_id: int) -> dt.datetime | None:
        """When the incident's earliest alert started firing (None: a /diagnose run)."""

        def read() -> dt.datetime | None:
            with self._db.transaction() as s:
                incident = store.get(s, incident_id)
                alerts = [] if incident is None else incident.alerts
                return min((a.started_at for a in alerts if a.started_at), default=None)

        return await asyncio.to_thread(read)

    async def root(self, incident_id: int) -> MessageRef | None:
        """The incident's root message, if posted."""

        def read() -> MessageRef | None:
            with self._db.transaction() as s:
                incident = store.get(s, incident_id)
                message = None if incident is None else store.root_message(s, incident)
                return None if message is None else MessageRef(message.channel, message.ts)

        return await asyncio.to_thread(read)

    async def open_manual(self, *, target: str, user_id: str, channel_id: str) -> int:
        """A /diagnose run's own incident, with its request audited and its messages owed."""
        now = self._clock()

        def create() -> int:
            with self._db.transaction() as s:
                incident = store.create(
                    s,
                    key=f"diagnose:{target}:{uuid.uuid4().hex[:12]}",
                    source="slash",
                    title=f"/diagnose {target}",
                    target=target,
                    labels={"requested_by": user_id},
                    at=now,
                )
                store.audit(
                    s,
                    at=now,
                    actor=user_id,
                    action="diagnose.requested",
                    incident=incident,
                    detail={"target": target, "channel": channel_id},
                )
                items.owe_root(s, incident.id, at=now, channel=channel_id)
                items.owe_diagnosis(s, incident.id, at=now)
                return incident.id

        return await asyncio.to_thread(create)

    async def close(self, incident_id: int) -> None:
        """Close an incident."""

        def write() -> None:
            with self._db.transaction() as s:
                incident = store.get(s, incident_id)
                assert incident is not None
                store.close(s, incident, at=self._clock())

        await asyncio.to_thread(write)

    async def owe(self, incident_id: int, *, root_channel: str | None = None, **item: Any) -> None:
        """Owe the incident one message (its root first, when none is owed yet)."""

        def write() -> None:
            with self._db.transaction() as s:
                items.owe_root(s, incident_id, at=self._clock(), channel=root_channel)
                if item:
                    items.owe(s, incident_id, at=self._clock(), **item)

        await asyncio.to_thread(write)

    async def owe_diagnosis(self, incident_id: int, *, channel: str | None) -> None:
        """Owe the incident its root message and a diagnosis (each once)."""

        def write() -> None:
            with self._db.transaction() as s:
                items.owe_root(s, incident_id, at=self._clock(), channel=channel)
                items.owe_diagnosis(s, incident_id, at=self._clock())

        await asyncio.to_thread(write)

    async def owe_root_change(self, incident_id: int) -> None:
        """Owe an update of the root message (or the root, when none is owed yet)."""

        def write() -> None:
            with self._db.transaction() as s:
                items.owe_root_change(s, incident_id, at=self._clock())

        await asyncio.to_thread(write)

    async def claim_diagnosis(self, incident_id: int, *, owner: str, ttl_s: float) -> bool:
        """Take the incident's owed diagnosis (False: none owed, done, or another runs it)."""

        def write() -> bool:
            with self._db.transaction() as s:
                owed = items.find(s, incident_id, items.DIAGNOSE)
                if owed is None:
                    return False
                now = self._clock()
                ttl = dt.timedelta(seconds=ttl_s)
                return (
                    items.claim(s, owed.id, owner=owner, now=now, ttl=ttl, force=True) is not None
                )

        return await asyncio.to_thread(write)

    async def due_diagnoses(self, *, older_than: dt.timedelta) -> list[int]:
        """Incidents owed a diagnosis for ``older_than`` that nobody runs."""

        def read() -> list[int]:
            now = self._clock()
            with self._db.transaction() as s:
                return items.due_diagnoses(s, now=now, owed_before=now - older_than)

        return await asyncio.to_thread(read)

    async def owed_error(self, incident_id: int, key: str) -> str | None:
        """Why the incident's item ``key`` was not delivered yet (None: no failure)."""

        def read() -> str | None:
            with self._db.transaction() as s:
                item = items.find(s, incident_id, key)
                return None if item is None else item.last_error

        return await asyncio.to_thread(read)

    async def remember(self, incident_id: int, summary: DiagnosisSummary) -> str | None:
        """The thread's line of what the store remembers of the diagnosis's supported causes on
        this target (``bot.incidents.memory``); None when there is nothing to say."""

        def read() -> str | None:
            with self._db.transaction() as s:
                incident = store.get(s, incident_id)
                assert incident is not None
                return memory.memory_text(memory.recall(s, incident, summary))

        return await asyncio.to_thread(read)

    async def diagnosed(
        self,
        incident_id: int,
        *,
        action: str,
        detail: Mapping[str, object],
        summary: DiagnosisSummary,
        messages: list[dict[str, Any]],
        update: Mapping[str, Any],
        buttons_of: ButtonsOf | None = None,
    ) -> bool:
        """Keep a diagnosis's end and owe its messages (and, by ``buttons_of``, the thread's
        Silence / Acknowledge buttons after them), in one transaction; False if another
        replica's diagnosis of the incident was kept first (nothing is written then)."""

        def write() -> bool:
            now = self._clock()
            with self._db.transaction() as s:
                incident = store.get(s, incident_id)
                assert incident is not None
                owed = items.find(s, incident_id, items.DIAGNOSE)
                if owed is not None and owed.state != items.PENDING:
                    return False
                store.set_summary(s, incident, summary=summary)
                store.audit(
                    s, at=now, actor="ruleloop", action=action, incident=incident, detail=detail
                )
                for n, message in enumerate(messages):
                    items.owe(
                        s,
                        incident_id,
                        kind=items.REPLY,
                        key=f"diagnosis:{n}",
                        at=now,
                        payload=message,
                    )
                if buttons_of is not None:
                    _owe_buttons(s, incident, buttons_of, now=now)
                items.owe(s, incident_id, kind=items.UPDATE, at=now, payload=update)
                if owed is not None:
                    owed.state, owed.done_at, owed.claimed_by, owed.claimed_until = (
                        items.SENT,
                        now,
                        None,
                        None,
                    )
                return True

        return await asyncio.to_thread(write)
