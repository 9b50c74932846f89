"""Store operations on decision records (ADRs), each on the caller's session.

A record changes only by a conditional UPDATE on the version the caller read (``change``): of
two writers, the one that read a stale version changes nothing and is told so. Every version a
record has had is kept in ``adr_revisions``, with who wrote it and why.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any, cast

from sqlalchemy import select, text, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from bot.kernel.store.models import AdrRecord, AdrRevision

SYNC_LOCK = 0x61647273  # pg_advisory_xact_lock key of ADR directory imports ("adrs")


def sha_of(markdown: str) -> str:
    """The SHA-256 of a record's text (what imports compare)."""
    return hashlib.sha256(markdown.encode("utf-8")).hexdigest()


def get(session: Session, adr_id: str) -> AdrRecord | None:
    """The record with exactly this id, or None."""
    return session.scalars(select(AdrRecord).where(AdrRecord.adr_id == adr_id)).one_or_none()


def listed(session: Session, *, drafts: bool = True) -> list[AdrRecord]:
    """The records (not drafts) by file name, then the drafts by file name."""
    query = select(AdrRecord).order_by(AdrRecord.draft, AdrRecord.name)
    if not drafts:
        query = query.where(AdrRecord.draft.is_(False))
    return list(session.scalars(query))


def ids_with_prefix(session: Session, prefix: str) -> list[str]:
    """The ids starting with ``prefix`` (the ids of one day: 'ADR-20261201-')."""
    query = select(AdrRecord.adr_id).where(AdrRecord.adr_id.startswith(prefix, autoescape=True))
    return list(session.scalars(query))


def seen(session: Session, adr_id: str, sha: str) -> bool:
    """Whether this record ever had this exact text."""
    query = select(AdrRevision.id).where(AdrRevision.adr_id == adr_id, AdrRevision.sha == sha)
    return session.scalars(query.limit(1)).first() is not None


def revisions(session: Session, adr_id: str) -> list[AdrRevision]:
    """Every version of a record, oldest first."""
    query = select(AdrRevision).where(AdrRevision.adr_id == adr_id).order_by(AdrRevision.version)
    return list(session.scalars(query))


def lock_for_sync(session: Session) -> None:
    """Serialize directory imports across replicas (PostgreSQL; SQLite serializes writers)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SYNC_LOCK})


def insert(
    session: Session, *, adr_id: str, name: str, draft: bool, status: str, markdown: str,
    source: str, actor: str, at: dt.datetime, note: str, synced: bool,
) -> AdrRecord:  # fmt: skip
    """A new record (version 1); IntegrityError at flush when the id is taken."""
    sha = sha_of(markdown)
    row = AdrRecord(
        adr_id=adr_id, name=name, draft=draft, status=status, text=markdown, sha=sha, version=1,
        synced_sha=sha if synced else None, source=source, updated_by=actor, updated_at=at,
    )  # fmt: skip
    session.add(row)
    session.flush()
    _revision(session, row, note=note)
    return row


def change(
    session: Session, row: AdrRecord, *, name: str, draft: bool, status: str, markdown: str,
    source: str, actor: str, at: dt.datetime, note: str, synced: bool,
) -> AdrRecord | None:  # fmt: skip
    """The record at its next version, if ``row.version`` was still current; None otherwise."""
    sha = sha_of(markdown)
    values: dict[str, Any] = {
        "name": name, "draft": draft, "status": status, "text": markdown, "sha": sha,
        "version": row.version + 1, "source": source, "updated_by": actor, "updated_at": at,
    }  # fmt: skip
    if synced:
        values["synced_sha"] = sha
    statement = (
        update(AdrRecord)
        .where(AdrRecord.adr_id == row.adr_id, AdrRecord.version == row.version)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if cast(CursorResult[Any], session.execute(statement)).rowcount != 1:
        return None
    session.expire(row)
    fresh = get(session, row.adr_id)
    assert fresh is not None
    _revision(session, fresh, note=note)
    return fresh


def mark_synced(session: Session, row: AdrRecord, *, name: str, draft: bool) -> bool:
    """Record that the ADR directory holds this record's text (under ``name``); no new version."""
    statement = (
        update(AdrRecord)
        .where(AdrRecord.adr_id == row.adr_id, AdrRecord.version == row.version)
        .values(synced_sha=row.sha, name=name, draft=draft)
        .execution_options(synchronize_session=False)
    )
    return cast(CursorResult[Any], session.execute(statement)).rowcount == 1


def _revision(session: Session, row: AdrRecord, *, note: str) -> None:
    session.add(
        AdrRevision(
            adr_id=row.adr_id, version=row.version, sha=row.sha, status=row.status,
            source=row.source, actor=row.updated_by, at=row.updated_at, note=note, text=row.text,
        )
    )  # fmt: skip
