"""Single-use buttons (``ActionToken`` rows), each on the caller's session.

A button belongs to a subject, ``"<kind>:<key>"`` (``subject("remediation", 12)`` is
``"remediation:12"``, a draft's is ``"draft:ADR-..."``); ``subject_key`` reads the key back.
A subject's buttons are issued together, expire together (or never) and are spent together
when one of them is used. Using one is conditional (``usable``): of a double click, or one
click delivered to two replicas, one acts.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterable
from typing import Any, cast

from sqlalchemy import Exists, or_, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from bot.kernel.runtime.ids import new_token
from bot.kernel.store.db import Database
from bot.kernel.store.models import ActionToken


class ButtonReads:
    """What a flow's records read of its buttons: the one behind a click (async, as the
    records are)."""

    _db: Database

    async def token(self, value: str) -> ActionToken | None:
        """The button with this value, if this bot issued it."""

        def run() -> ActionToken | None:
            with self._db.transaction() as s:
                return find(s, value)

        return await asyncio.to_thread(run)


def subject(kind: str, key: object) -> str:
    """What a subject's buttons are for: ``subject("remediation", 12) == "remediation:12"``."""
    return f"{kind}:{key}"


def subject_key(value: str, kind: str) -> str | None:
    """The key of a subject of ``kind`` (``"12"`` of ``"remediation:12"``); None when the
    subject is of another kind, or not one ``subject`` makes."""
    found, sep, key = value.partition(":")
    if not sep or found != kind or not key or ":" in key:
        return None
    return key


def issue(
    session: Session,
    subject: str,
    kinds: Iterable[str],
    *,
    incident_id: int | None,
    now: dt.datetime,
    expires_at: dt.datetime | None = None,
) -> dict[str, str]:
    """New buttons of ``subject``, one per kind (kind -> value), usable until ``expires_at``
    (None: until used)."""
    tokens = {kind: new_token() for kind in kinds}
    for kind, token in tokens.items():
        session.add(
            ActionToken(
                token=token,
                kind=kind,
                subject=subject,
                incident_id=incident_id,
                created_at=now,
                expires_at=expires_at,
            )
        )
    return tokens


def find(session: Session, value: str) -> ActionToken | None:
    """The button with this value, if any."""
    return session.scalars(select(ActionToken).where(ActionToken.token == value)).one_or_none()


def live(session: Session, subject: str) -> dict[str, str]:
    """The unused buttons of a subject, kind -> value."""
    rows = session.scalars(
        select(ActionToken).where(ActionToken.subject == subject, ActionToken.used_at.is_(None))
    ).all()
    return {row.kind: row.token for row in rows}


def expires_at(session: Session, subject: str) -> dt.datetime | None:
    """When a subject's unused buttons expire (None: they do not, or there are none): a held
    change's, not those its request spent."""
    query = select(ActionToken.expires_at).where(
        ActionToken.subject == subject, ActionToken.used_at.is_(None)
    )
    return session.scalars(query).first()


def expired(session: Session, value: str, now: dt.datetime) -> dt.datetime | None:
    """When the unused button ``value`` expired, if it has by ``now``; None otherwise (no such
    button, used already, or still usable)."""
    row = find(session, value)
    if row is None or row.used_at is not None or row.expires_at is None or row.expires_at > now:
        return None
    return row.expires_at


def expired_keys(session: Session, kind: str, now: dt.datetime) -> set[str]:
    """The keys of the subjects of ``kind`` whose unused buttons have expired by ``now``."""
    query = select(ActionToken.subject).where(
        ActionToken.subject.like(f"{kind}:%"), ActionToken.expires_at <= now,
        ActionToken.used_at.is_(None),
    )  # fmt: skip
    keys = (subject_key(value, kind) for value in session.scalars(query))
    return {key for key in keys if key is not None}


def usable(value: str, now: dt.datetime) -> Exists:
    """The condition that the button ``value`` is unused and unexpired at ``now``: part of the
    conditional UPDATE that uses it, so a button that expires meanwhile changes nothing."""
    return (
        select(ActionToken.id)
        .where(
            ActionToken.token == value,
            ActionToken.used_at.is_(None),
            or_(ActionToken.expires_at.is_(None), ActionToken.expires_at > now),
        )
        .exists()
    )


def spend(session: Session, subject: str, *, user_id: str, now: dt.datetime) -> None:
    """Mark every unused button of ``subject`` used, by ``user_id`` at ``now``."""
    session.execute(
        update(ActionToken)
        .where(ActionToken.subject == subject, ActionToken.used_at.is_(None))
        .values(used_at=now, used_by=user_id)
    )


def use(session: Session, value: str, *, user_id: str, now: dt.datetime) -> bool:
    """Use the button ``value`` by ``user_id`` if it is unused and unexpired at ``now``, and
    spend the rest of its subject: the button's row is one conditional UPDATE, so of two
    clicks (or two replicas) exactly one gets True. For buttons that are their own claim (no
    state of their subject moves with them, unlike a remediation's Approve)."""
    claimed = session.execute(
        update(ActionToken)
        .where(
            ActionToken.token == value,
            ActionToken.used_at.is_(None),
            or_(ActionToken.expires_at.is_(None), ActionToken.expires_at > now),
        )
        .values(used_at=now, used_by=user_id)
    )
    if cast(CursorResult[Any], claimed).rowcount != 1:
        return False
    row = find(session, value)
    assert row is not None
    spend(session, row.subject, user_id=user_id, now=now)
    return True


def used_text(row: ActionToken, *, what: str) -> str | None:
    """Why the button ``row`` cannot be used again (who used it, when), or None when it is
    unused; ``what`` says what it is now (e.g. "ADR-0001 is now applied")."""
    if row.used_at is None:
        return None
    return (
        f"This button was already used by <@{row.used_by}> at {row.used_at:%H:%M:%S} UTC "
        f"({what}). Nothing was changed."
    )
