"""Writing stored ADRs out as the Markdown files the team keeps in git (`ruleloop adr export`).

Each record is written byte for byte as the store holds it: an imported file as it was read, a
record the bot wrote as ``bot.adr.render`` rendered it. A record goes to ``DIR/<name>``, a draft
to ``DIR/drafts/<name>``; another ``ADR-*.md`` file there with the same id (the draft of an ADR
since accepted, an old slug) is removed, so that one file carries each id. Files of ids the
store does not know are left alone. Each file is replaced atomically (written aside, renamed).
A stored name that is not a plain ``ADR-<id>-….md`` file name of its record (``../x``, a path)
is refused before anything is written.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from bot.adr.store import DRAFTS, GLOB, file_id
from bot.kernel import UsageError


class StoredText(Protocol):
    """What an export needs of a stored record."""

    adr_id: str
    name: str
    draft: bool
    text: str


@dataclass
class Exported:
    """The files an export wrote, found already equal, and removed."""

    written: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)


def write_records(records: Iterable[StoredText], target: Path) -> Exported:
    """Write each record under ``target``; UsageError when ``target`` cannot be written."""
    records = list(records)
    for record in records:  # all checked before anything is written
        _refuse_unsafe_name(record)
    done = Exported()
    try:
        (target / DRAFTS).mkdir(parents=True, exist_ok=True)
        existing = sorted(target.glob(GLOB)) + sorted((target / DRAFTS).glob(GLOB))
        for record in records:
            path = target / DRAFTS / record.name if record.draft else target / record.name
            data = record.text.encode("utf-8")
            if path.is_file() and path.read_bytes() == data:
                done.unchanged.append(path)
            else:
                _replace(path, data)
                done.written.append(path)
            for other in existing:
                if other != path and file_id(other) == record.adr_id and other.exists():
                    other.unlink()
                    done.removed.append(other)
    except OSError as exc:
        raise UsageError(f"cannot write the ADRs into {target}: {exc}") from exc
    return done


def _refuse_unsafe_name(record: StoredText) -> None:
    """UsageError unless the stored name is a plain ``ADR-*.md`` file name of the record's own
    id: a name with ``../`` (or a path, or a backslash) wrote outside DIR."""
    name = record.name
    plain = (
        name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and "\x00" not in name
        and Path(name).name == name
        and file_id(Path(name)) == record.adr_id
    )
    if not plain:
        raise UsageError(
            f"{record.adr_id}: the stored file name {name!r} is not a file name of that ADR "
            "(ADR-…-slug.md, no directories): nothing was exported; fix the record's name"
        )


def _replace(path: Path, data: bytes) -> None:
    temp = path.with_name(f".{path.name}.tmp")  # not ADR-*.md: an import never reads it
    try:
        temp.write_bytes(data)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
