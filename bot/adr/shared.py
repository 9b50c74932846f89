"""The decision store in the database: the ADRs every replica of the bot reads and writes.

``SharedAdrStore`` answers what ``AdrStore`` answers (records, accepted, find, next id), from
the store's ``adr_records``. Its directory (the shipped or configured ``adr/``) is imported when
the bot starts (``sync``) and again whenever a file in it changes (bot.adr.sync has the rules),
so a file edited on a single host still counts at once. Nothing is written into the directory:
drafts and decisions live in the store, and ``ruleloop adr export DIR`` writes them as files.
The paths it returns are where an export to a directory named like ``root`` puts each record
(``adr/drafts/ADR-...md``), not files that exist.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.orm import Session

from bot.adr.export import Exported, write_records
from bot.adr.models import Adr
from bot.adr.parse import parse
from bot.adr.render import render
from bot.adr.store import DRAFTS, GLOB, AdrStore, file_name
from bot.adr.sync import Imported, import_files, read_dir
from bot.kernel import AdrError, UnknownAdr
from bot.kernel.store import AdrRecord, Database
from bot.kernel.store import adrs as rows

log = logging.getLogger("ruleloop.adr")
Fingerprint = tuple[tuple[str, int, int], ...]


def utcnow() -> dt.datetime:
    """The wall clock, as an aware UTC datetime."""
    return dt.datetime.now(dt.UTC)


@functools.lru_cache(maxsize=512)
def _parsed(markdown: str, where: str) -> Adr:
    return parse(markdown, file=where)


class SharedAdrStore(AdrStore):
    """ADRs in the database, imported from ``root``; ``sync=False`` only reads (the CLI)."""

    def __init__(
        self,
        *,
        root: Path,
        db: Database,
        sync: bool = True,
        clock: Callable[[], dt.datetime] = utcnow,
    ) -> None:
        super().__init__(root=root)
        self.db = db
        self._sync = sync
        self._clock = clock
        self._seen: Fingerprint | None = None
        self._file_problems: list[tuple[Path, str]] = []
        self._sync_lock = threading.Lock()

    # --- the directory ----------------------------------------------------------------------
    def sync(self) -> Imported | None:
        """Import the directory if a file in it changed since the last import (None: none did)."""
        if not self._sync:
            return None
        with self._sync_lock:
            now = self._fingerprint()
            if now == self._seen:
                return None
            files, skipped = read_dir(self.root)
            with self.db.transaction() as s:
                done = import_files(s, files, at=self._clock())
            done.skipped = skipped
            for path, why in skipped:
                if (path, why) not in self._warned:
                    self._warned.add((path, why))
                    log.warning("skipped ADR file %s: %s", path, why)
            self._file_problems = skipped
            self._seen = now
            return done

    def _fingerprint(self) -> Fingerprint:
        found = []
        for folder in (self.root, self.root / DRAFTS):
            if folder.is_dir():
                for path in sorted(folder.glob(GLOB)):
                    try:
                        stat = path.stat()
                    except OSError:
                        continue
                    found.append((str(path), stat.st_mtime_ns, stat.st_size))
        return tuple(found)

    # --- reading ----------------------------------------------------------------------------
    def location(self, row: AdrRecord) -> Path:
        """Where ``ruleloop adr export`` puts this record, under a directory named like root."""
        base = Path(self.root.name or "adr")
        return base / DRAFTS / row.name if row.draft else base / row.name

    def rows(self, *, include_drafts: bool = True) -> list[AdrRecord]:
        """The stored records (records first, then drafts), after importing any changed file."""
        self.sync()
        with self.db.transaction() as s:
            return rows.listed(s, drafts=include_drafts)

    def row(self, adr_id: str) -> AdrRecord | None:
        """The stored record with exactly this id, after importing any changed file."""
        self.sync()
        with self.db.transaction() as s:
            return rows.get(s, adr_id)

    def parsed(self, row: AdrRecord) -> Adr:
        """The record a stored text holds (parsed once per text)."""
        return _parsed(row.text, str(self.location(row)))

    def entries(self, *, include_drafts: bool = True) -> list[tuple[Path, Adr]]:
        """Each stored record with where it exports to; AdrError on one that does not parse."""
        found = self.rows(include_drafts=include_drafts)
        return [(self.location(row), self.parsed(row)) for row in found]

    def scan(self, *, include_drafts: bool = False) -> tuple[list[Adr], list[tuple[Path, str]]]:
        """The stored records that parse; the directory's files that did not import, and why."""
        records: list[Adr] = []
        broken: list[tuple[Path, str]] = []
        for row in self.rows(include_drafts=include_drafts):  # imports changed files first
            try:
                records.append(self.parsed(row))
            except AdrError as exc:
                broken.append((self.location(row), exc.why))
        files = [
            (path, why)
            for path, why in self._file_problems
            if include_drafts or path.parent != self.drafts_dir
        ]
        return records, [*files, *broken]

    def find(self, adr_id: str) -> tuple[Path, Adr] | None:
        """Where the record with exactly this id exports to, and the record; or None."""
        row = self.row(adr_id)
        return None if row is None else (self.location(row), self.parsed(row))

    def get_or_raise(self, adr_id: str) -> Adr:
        """The record with this id; UsageError naming the known ids when there is none."""
        found = self.find(adr_id)
        if found is None:
            known = [r.adr_id for r in self.rows()]
            raise UnknownAdr(adr_id, known=known, where=f"{self.root} or in the store")
        return found[1]

    def next_id(self, day: dt.date) -> str:
        """The first id of the day that no stored record (draft or not) has."""
        self.sync()
        with self.db.transaction() as s:
            return self.free_id(s, day)

    @staticmethod
    def free_id(session: Session, day: dt.date) -> str:
        """The first free id of a day, read on ``session``."""
        prefix = f"ADR-{day:%Y%m%d}-"
        taken = {
            int(rest) for i in rows.ids_with_prefix(session, prefix)
            if (rest := i.removeprefix(prefix)).isdigit()
        }  # fmt: skip
        number = 1
        while number in taken:
            number += 1
        return f"{prefix}{number:02d}"

    # --- writing ----------------------------------------------------------------------------
    def add_draft(
        self, session: Session, adr: Adr, *, source: str, actor: str, at: dt.datetime,
        slug: str | None = None,
    ) -> AdrRecord:  # fmt: skip
        """Store a proposed draft on ``session``; IntegrityError at flush when its id is taken."""
        return rows.insert(
            session, adr_id=adr.id, name=file_name(adr, slug=slug), draft=True, status=adr.status,
            markdown=render(adr), source=source, actor=actor, at=at,
            note=f"drafted by {actor}", synced=False,
        )  # fmt: skip

    def write_draft(self, adr: Adr, *, slug: str | None = None) -> Path:
        """Store a proposed draft; AdrError when its id is taken."""
        with self.db.transaction() as s:
            if rows.get(s, adr.id) is not None:
                raise AdrError("already in the store; pick another id", file=adr.id)
            row = self.add_draft(
                s, adr, source="bot", actor="ruleloop", at=self._clock(), slug=slug
            )
        return self.location(row)

    def export(self, target: Path) -> Exported:
        """Write every stored record into ``target`` as the same Markdown files."""
        return write_records(self.rows(), target)
