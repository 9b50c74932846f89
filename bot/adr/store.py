"""The ADR files under one directory (`adr/`), drafts in `adr/drafts/`.

This is what the command line reads without a database; the bot reads the same interface from
its database (``bot.adr.shared.SharedAdrStore``), which imports this directory.

A file that does not parse costs only itself where the bot reads many (``records``,
``accepted``): it is skipped, logged once, and listed by ``skipped`` (diagnoses say so), so one
bad file cannot stop every diagnosis. ``entries`` (``ruleloop adr list``) still refuses it.
An id names one record exactly: ``ADR-20260831`` is not ``ADR-20260831-01``.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from pathlib import Path

from bot.adr.models import Adr
from bot.adr.parse import load
from bot.adr.render import render
from bot.kernel import AdrError, UnknownAdr, UsageError

log = logging.getLogger("ruleloop.adr")
GLOB = "ADR-*.md"
DRAFTS = "drafts"
FILE_ID = re.compile(r"^(ADR-\d{8}-\d+)(?:-.*)?\.md$")  # the id part of a file name
SLUG = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
SLUG_MAX = 64


def check_slug(slug: str) -> str:
    """``slug`` if it is a file-name word (no '/', '..', spaces); UsageError otherwise."""
    if len(slug) > SLUG_MAX or not SLUG.match(slug):
        raise UsageError(
            f"--slug must be lowercase letters, digits and single hyphens (at most {SLUG_MAX}), "
            f"such as prefix-caching; not {slug!r}"
        )
    return slug


def file_id(path: Path) -> str | None:
    """The ADR id a file name carries ('ADR-20260831-01-kv.md' -> 'ADR-20260831-01')."""
    match = FILE_ID.match(path.name)
    return match[1] if match else None


def slugify(title: str, *, limit: int = 48) -> str:
    """A file-name slug from a title's ASCII words ('vLLM KV Cache 调优' -> 'vllm-kv-cache')."""
    slug = ""
    for word in re.findall(r"[a-z0-9]+", title.lower()):
        longer = f"{slug}-{word}" if slug else word
        if len(longer) > limit:
            break
        slug = longer
    return slug or "decision"


def file_name(adr: Adr, *, slug: str | None = None) -> str:
    """The file name an ADR is stored under: '<id>-<slug>.md' (a given slug is checked)."""
    return f"{adr.id}-{slugify(adr.title) if slug is None else check_slug(slug)}.md"


class AdrStore:
    """ADR files under ``root`` (accepted and other records) and ``root/drafts`` (drafts)."""

    def __init__(self, *, root: Path) -> None:
        self.root = root
        self.drafts_dir = root / DRAFTS
        self._warned: set[tuple[Path, str]] = set()

    def paths(self, *, include_drafts: bool = True) -> list[Path]:
        """The ADR files, records first, then drafts, each sorted by name."""
        found = sorted(self.root.glob(GLOB)) if self.root.is_dir() else []
        if include_drafts and self.drafts_dir.is_dir():
            found += sorted(self.drafts_dir.glob(GLOB))
        return found

    def entries(self, *, include_drafts: bool = True) -> list[tuple[Path, Adr]]:
        """Each ADR file with its record; raise AdrError on the first file that does not parse."""
        return [(path, load(path)) for path in self.paths(include_drafts=include_drafts)]

    def scan(self, *, include_drafts: bool = False) -> tuple[list[Adr], list[tuple[Path, str]]]:
        """The records that parse, and each file that does not with why (logged once)."""
        records: list[Adr] = []
        skipped: list[tuple[Path, str]] = []
        for path in self.paths(include_drafts=include_drafts):
            try:
                records.append(load(path))
            except AdrError as exc:
                why = f"{exc.field}: {exc.why}" if exc.field else exc.why
                skipped.append((path, why))
                if (path, why) not in self._warned:
                    self._warned.add((path, why))
                    log.warning("skipped ADR file %s: %s", path, why)
        return records, skipped

    def records(self, *, include_drafts: bool = False) -> list[Adr]:
        """The records that parse, optionally with the drafts (see ``skipped``)."""
        return self.scan(include_drafts=include_drafts)[0]

    def skipped(self) -> list[tuple[Path, str]]:
        """The record files (not drafts) that do not parse, with why."""
        return self.scan()[1]

    def accepted(self) -> list[Adr]:
        """The accepted records: the pre-approved fixes (drafts never are)."""
        return [adr for adr in self.records() if adr.status == "accepted"]

    def find(self, adr_id: str) -> tuple[Path, Adr] | None:
        """The file and record with exactly this id (records before drafts), or None."""
        for path in self.paths():
            if file_id(path) == adr_id:
                return path, load(path)
        return None

    def get_or_raise(self, adr_id: str) -> Adr:
        """The record with this id; UsageError naming the known ids when there is none."""
        found = self.find(adr_id)
        if found is None:
            known = ["-".join(p.name.split("-")[:3]) for p in self.paths()]
            raise UnknownAdr(adr_id, known=known, where=str(self.root))
        return found[1]

    def next_id(self, day: dt.date) -> str:
        """The first free id for a day, counting records and drafts: ADR-YYYYMMDD-NN."""
        prefix = f"ADR-{day:%Y%m%d}-"
        taken = {
            int(m[1]) for p in self.paths() if (m := re.match(re.escape(prefix) + r"(\d+)", p.name))
        }
        number = 1
        while number in taken:
            number += 1
        return f"{prefix}{number:02d}"

    def write_draft(self, adr: Adr, *, slug: str | None = None) -> Path:
        """Render a draft into ``root/drafts``; refuse to overwrite an existing file."""
        name = file_name(adr, slug=slug)  # checked before anything is created
        self.drafts_dir.mkdir(parents=True, exist_ok=True)
        path = self.drafts_dir / name
        if path.exists():
            raise AdrError(
                "already exists; pick another id or remove the old draft", file=str(path)
            )
        path.write_text(render(adr), encoding="utf-8")
        return path
