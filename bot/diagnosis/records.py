"""The incident records the flows read and write, as awaitables (store work runs in threads)."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Callable, Mapping

from bot.diagnosis.ports import IncidentView, MessageRef
from bot.errors import UsageError
from bot.store import service as store
from bot.store.db import Database
from bot.store.models import Incident


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

    async def view(self, incident_id: int, state: str) -> IncidentView:
        """What the root message shows now."""
        i = await self.load(incident_id)
        return IncidentView(
            id=i.id,
            title=i.title,
            status=i.status,
            source=i.source,
            target=i.target,
            opened_at=i.opened_at,
            closed_at=i.closed_at,
            state=state,
            summary=dict(i.summary or {}),
            requested_by=i.labels.get("requested_by") if i.source == "slash" else None,
        )

    async def root(self, incident_id: int) -> MessageRef | None:
        """The incident's root message, if posted."""

        def read() -> MessageRef | None:
            with self._db.transaction() as s:
                incident = store.get(s, incident_id)
                message = None if incident is None else store.root_message(s, incident)
                return None if message is None else MessageRef(message.channel, message.ts)

        return await asyncio.to_thread(read)

    async def remember_root(self, incident_id: int, ref: MessageRef) -> None:
        """Store the root message and audit its posting."""

        def write() -> None:
            with self._db.transaction() as s:
                incident = store.get(s, incident_id)
                assert incident is not None
                store.add_message(
                    s, incident, kind="root", channel=ref.channel, ts=ref.ts, thread_ts=ref.ts
                )
                store.audit(
                    s,
                    at=self._clock(),
                    actor="ruleloop",
                    action="slack.root_posted",
                    incident=incident,
                    detail={"channel": ref.channel, "ts": ref.ts},
                )

        await asyncio.to_thread(write)

    async def write(
        self,
        incident_id: int,
        action: str,
        *,
        detail: Mapping[str, object],
        actor: str = "ruleloop",
        summary: Mapping[str, object] | None = None,
    ) -> None:
        """Append an audit entry (and keep the diagnosis summary, when given)."""

        def write() -> None:
            with self._db.transaction() as s:
                incident = store.get(s, incident_id)
                assert incident is not None
                if summary is not None:
                    store.set_summary(s, incident, summary=summary)
                store.audit(
                    s,
                    at=self._clock(),
                    actor=actor,
                    action=action,
                    incident=incident,
                    detail=detail,
                )

        await asyncio.to_thread(write)

    async def open_manual(self, *, target: str, user_id: str, channel_id: str) -> int:
        """A /diagnose run's own incident, with its request audited."""
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
