"""The decision store: the ADR files under one directory (`adr/`), drafts in `adr/drafts/`."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from bot.adr.models import Adr
from bot.adr.parse import load
from bot.adr.render import render
from bot.errors import AdrError, UsageError

GLOB = "ADR-*.md"
DRAFTS = "drafts"


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
    """The file name an ADR is stored under: '<id>-<slug>.md'."""
    return f"{adr.id}-{slug or slugify(adr.title)}.md"


class AdrStore:
    """ADR files under ``root`` (accepted and other records) and ``root/drafts`` (drafts)."""

    def __init__(self, *, root: Path) -> None:
        self.root = root
        self.drafts_dir = root / DRAFTS

    def paths(self, *, include_drafts: bool = True) -> list[Path]:
        """The ADR files, records first, then drafts, each sorted by name."""
        found = sorted(self.root.glob(GLOB)) if self.root.is_dir() else []
        if include_drafts and self.drafts_dir.is_dir():
            found += sorted(self.drafts_dir.glob(GLOB))
        return found

    def entries(self, *, include_drafts: bool = True) -> list[tuple[Path, Adr]]:
        """Each ADR file with its record; raise AdrError on the first file that does not parse."""
        return [(path, load(path)) for path in self.paths(include_drafts=include_drafts)]

    def records(self, *, include_drafts: bool = False) -> list[Adr]:
        """The records, optionally with the drafts."""
        return [adr for _, adr in self.entries(include_drafts=include_drafts)]

    def accepted(self) -> list[Adr]:
        """The accepted records: the pre-approved fixes (drafts never are)."""
        return [adr for adr in self.records() if adr.status == "accepted"]

    def find(self, adr_id: str) -> tuple[Path, Adr] | None:
        """The file and record with this id (records before drafts), or None."""
        for path in self.paths():
            if path.name == f"{adr_id}.md" or path.name.startswith(f"{adr_id}-"):
                return path, load(path)
        return None

    def get_or_raise(self, adr_id: str) -> Adr:
        """The record with this id; UsageError naming the known ids when there is none."""
        found = self.find(adr_id)
        if found is None:
            known = ", ".join("-".join(p.name.split("-")[:3]) for p in self.paths()) or "none"
            raise UsageError(f"no ADR {adr_id} under {self.root} (known: {known})")
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
        self.drafts_dir.mkdir(parents=True, exist_ok=True)
        path = self.drafts_dir / file_name(adr, slug=slug)
        if path.exists():
            raise AdrError(
                "already exists; pick another id or remove the old draft", file=str(path)
            )
        path.write_text(render(adr), encoding="utf-8")
        return path
