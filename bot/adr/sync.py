"""Importing an ADR directory (the shipped or configured `adr/`) into the store.

Each ``ADR-*.md`` file (``drafts/`` included) is compared with the store's record of its id:

new         no record of the id yet: the file is imported.
same        the record holds the file's text: they agree (noted, nothing changes).
older       the record held this exact text before and has moved on since (a replica started
            from an older image, a stale checkout): the store keeps its newer version.
file wins   the record has not changed in the store since it last agreed with the directory,
            and the file has: the file was edited in git, so it becomes the record.
store wins  the record changed in the store since it last agreed with the directory (accepted
            or rejected in Slack, drafted by the bot) and the file differs: the decision made
            in the store is kept, and a warning says to export it (`ruleloop adr export`) and
            commit it; once the file holds it, the file owns the record again.

A file that does not parse is skipped and reported (as the file store does); a record removed
from the directory stays in the store (retire an ADR by marking it superseded or rejected).
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import Session

from bot.adr.models import Adr
from bot.adr.parse import parse
from bot.adr.store import DRAFTS, GLOB, file_id
from bot.kernel import AdrError
from bot.kernel.store import AdrRecord
from bot.kernel.store import adrs as rows

log = logging.getLogger("ruleloop.adr")
SOURCE = "file"


class Action(enum.Enum):
    """What an import does with one file (see the module docstring)."""

    NEW = "new"
    SAME = "same"
    OLDER = "older"
    FILE_WINS = "file wins"
    STORE_WINS = "store wins"


def decide(*, file_sha: str, row: AdrRecord | None, seen_before: bool) -> Action:
    """The rule for one file against the store's record of its id."""
    if row is None:
        return Action.NEW
    if row.sha == file_sha:
        return Action.SAME
    if seen_before:
        return Action.OLDER
    if row.sha == row.synced_sha:
        return Action.FILE_WINS
    return Action.STORE_WINS


@dataclass(frozen=True)
class AdrFile:
    """One parsed ADR file of the directory."""

    path: Path
    adr: Adr
    text: str
    draft: bool

    @property
    def sha(self) -> str:
        """The SHA-256 of the file's text."""
        return rows.sha_of(self.text)


@dataclass
class Imported:
    """What one import did, per file (paths) and what it refused (path, why)."""

    actions: dict[Path, Action] = field(default_factory=dict)
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    def count(self, action: Action) -> int:
        """How many files met this rule."""
        return sum(a is action for a in self.actions.values())

    def summary(self) -> str:
        """One line: how many files each rule met."""
        counts = [f"{self.count(a)} {a.value}" for a in Action if self.count(a)]
        skipped = [f"{len(self.skipped)} skipped"] if self.skipped else []
        return ", ".join(counts + skipped) or "no ADR files"


def read_dir(root: Path) -> tuple[list[AdrFile], list[tuple[Path, str]]]:
    """The ADR files under ``root`` that parse, and each that does not with why.

    Records come before drafts; of two files with one id, the first is kept.
    """
    paths = sorted(root.glob(GLOB)) if root.is_dir() else []
    drafts_dir = root / DRAFTS
    if drafts_dir.is_dir():
        paths += sorted(drafts_dir.glob(GLOB))
    found: list[AdrFile] = []
    skipped: list[tuple[Path, str]] = []
    first: dict[str, Path] = {}
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
            adr = parse(text, file=str(path))
        except (OSError, UnicodeDecodeError) as exc:
            skipped.append((path, f"cannot read: {exc}"))
            continue
        except AdrError as exc:
            skipped.append((path, f"{exc.field}: {exc.why}" if exc.field else exc.why))
            continue
        if file_id(path) != adr.id:
            skipped.append((path, f"id: the file name must start with the id: {adr.id}-<slug>.md"))
        elif adr.id in first:
            skipped.append((path, f"id: {adr.id} is already the id of {first[adr.id].name}"))
        else:
            first[adr.id] = path
            found.append(AdrFile(path=path, adr=adr, text=text, draft=path.parent == drafts_dir))
    return found, skipped


def import_files(session: Session, files: list[AdrFile], *, at: dt.datetime) -> Imported:
    """Apply the rules to each file in one transaction (serialized across replicas)."""
    rows.lock_for_sync(session)
    done = Imported()
    for file in files:
        row = rows.get(session, file.adr.id)
        sha = file.sha
        action = decide(
            file_sha=sha,
            row=row,
            seen_before=row is not None and rows.seen(session, file.adr.id, sha),
        )
        done.actions[file.path] = action
        place = (sha, file.path.name, file.draft)
        where = f"{file.path.parent.name}/{file.path.name}"
        if action is Action.NEW:
            rows.insert(
                session, adr_id=file.adr.id, name=file.path.name, draft=file.draft,
                status=file.adr.status, markdown=file.text, source=SOURCE, actor=where, at=at,
                note=f"imported from {where}", synced=True,
            )  # fmt: skip
        elif row is None:
            continue
        elif action is Action.SAME and (row.synced_sha, row.name, row.draft) != place:
            rows.mark_synced(session, row, name=file.path.name, draft=file.draft)
        elif action is Action.FILE_WINS:
            rows.change(
                session, row, name=file.path.name, draft=file.draft, status=file.adr.status,
                markdown=file.text, source=SOURCE, actor=where, at=at,
                note=f"{where} changed since version {row.version}", synced=True,
            )  # fmt: skip
        elif action is Action.OLDER:
            log.info(
                "%s holds an older version of %s; the store keeps version %d",
                file.path, row.adr_id, row.version,
            )  # fmt: skip
        elif action is Action.STORE_WINS:
            log.warning(
                "%s differs from %s in the store (version %d, %s by %s via %s): the store "
                "keeps its version; write it out with `ruleloop adr export DIR` and commit it",
                file.path, row.adr_id, row.version, row.status, row.updated_by, row.source,
            )  # fmt: skip
    return done
