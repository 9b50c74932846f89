"""Review of ADR drafts: who may review, and what a decided draft becomes.

``decided`` is the record a decision makes of a draft (its status, the reviewer among the
deciders, the review noted under its own heading), checked as the validator checks; the bot
writes it into the store (bot.postmortem.records). ``accept_draft`` / ``reject_draft`` do the
same on a file directory: the draft leaves ``adr/drafts/`` for ``adr/`` under the same file
name (the validator allows only proposed records in drafts/), atomically in the sense that
matters: at every moment exactly one ADR file carries the id.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from bot.adr.models import Adr, Status
from bot.adr.parse import load
from bot.adr.render import render
from bot.adr.store import AdrStore
from bot.adr.validate import check_record
from bot.errors import AdrError, NotAllowed, UsageError
from bot.runtime.access import who_may

REVIEW_HEADING = "## 评审记录 (Review)"
NOBODY = (
    "Nobody may review ADR drafts yet: set `review = [...]` under [access] in the bot's config "
    '(Slack user IDs, or "*" for everyone).'
)
NOT_LISTED = "You may not review ADR drafts. Allowed: {allowed}."
SELF_REVIEW = (
    "You wrote this draft ({author}), so you cannot accept it: another reviewer must "
    "(two people look at every rule before it can change a fleet)."
)


def check_reviewer(*, reviewer: str, author: str, reviewers: list[str]) -> None:
    """Raise NotAllowed unless ``reviewer`` may accept a draft that ``author`` wrote."""
    if not reviewers:
        raise NotAllowed(NOBODY)
    if "*" not in reviewers and reviewer not in reviewers:
        raise NotAllowed(NOT_LISTED.format(allowed=who_may(reviewers)))
    if reviewer == author:
        raise NotAllowed(SELF_REVIEW.format(author=author))


def accept_draft(store: AdrStore, adr_id: str, *, reviewer: str, day: dt.date) -> Path:
    """Move a proposed draft into adr/ as accepted; the path of the accepted record."""
    return _decide(
        store,
        adr_id,
        status="accepted",
        reviewer=reviewer,
        note=f"accepted by {reviewer}.",
        day=day,
    )


def reject_draft(
    store: AdrStore, adr_id: str, *, reviewer: str, reason: str, day: dt.date | None = None
) -> Path:
    """Move a proposed draft into adr/ as rejected, with the reason; the path of the record."""
    note = rejection_note(adr_id, reviewer=reviewer, reason=reason)
    return _decide(store, adr_id, status="rejected", reviewer=reviewer, note=note, day=day)


def _decide(
    store: AdrStore, adr_id: str, *, status: Status, reviewer: str, note: str, day: dt.date | None
) -> Path:
    draft_path, draft = _proposed_draft(store, adr_id)
    final = store.root / draft_path.name
    record = decided(draft, status=status, reviewer=reviewer, note=note, day=day, name=final.name)
    _move(draft_path, final, render(record))
    runs = draft_path.with_suffix(".runs")  # `ruleloop tune` keeps a draft's canary JSON here
    if runs.is_dir() and not final.with_suffix(".runs").exists():
        os.replace(runs, final.with_suffix(".runs"))
    return final


def decided(
    draft: Adr, *, status: Status, reviewer: str, note: str, day: dt.date | None, name: str
) -> Adr:
    """The draft as decided: its status, the reviewer among the deciders, the review noted.

    AdrError when the decided record breaks a rule (an accepted ADR without gates) or the
    draft is no longer proposed.
    """
    if draft.status != "proposed":
        raise AdrError(
            f"already {draft.status}; only a proposed draft can be accepted or rejected",
            file=name,
            field="status",
        )
    line = f"- {day:%Y-%m-%d}: {note}" if day is not None else f"- {note}"
    record = Adr.model_validate(
        draft.model_dump()
        | {
            "status": status,
            "deciders": [*draft.deciders, *([] if reviewer in draft.deciders else [reviewer])],
            "notes": "\n\n".join(p for p in (draft.notes, f"{REVIEW_HEADING}\n\n{line}") if p),
        }
    )
    problems = check_record(record, path=Path(name))
    if problems:
        raise problems[0].error()
    return record


def rejection_note(adr_id: str, *, reviewer: str, reason: str) -> str:
    """The review line of a rejection; UsageError without a reason."""
    reason = " ".join(reason.split())
    if not reason:
        raise UsageError(f"say why {adr_id} is rejected: the reason stays on record")
    return f"rejected by {reviewer}: {reason}"


def _proposed_draft(store: AdrStore, adr_id: str) -> tuple[Path, Adr]:
    """The draft file and record with this id; refuse when it is not an open draft."""
    for path in store.paths(include_drafts=False):
        if _carries(path, adr_id):
            raise AdrError(
                f"{adr_id} is already a record here (status {load(path).status}); "
                "only a draft in drafts/ can be accepted or rejected",
                file=str(path),
            )
    drafts = [p for p in store.paths() if p.parent == store.drafts_dir and _carries(p, adr_id)]
    if not drafts:
        known = ", ".join(p.name for p in store.paths() if p.parent == store.drafts_dir)
        raise UsageError(f"no draft {adr_id} in {store.drafts_dir} (drafts: {known or 'none'})")
    adr = load(drafts[0])
    if adr.status != "proposed":
        raise AdrError(
            f"already {adr.status}; only a proposed draft can be accepted or rejected",
            file=str(drafts[0]),
            field="status",
        )
    return drafts[0], adr


def _carries(path: Path, adr_id: str) -> bool:
    return path.name == f"{adr_id}.md" or path.name.startswith(f"{adr_id}-")


def _move(draft: Path, final: Path, text: str) -> None:
    """Replace ``draft`` by ``final`` holding ``text``; one of the two exists at every moment."""
    temp = final.with_name(f".{final.name}.tmp")  # not ADR-*.md: the store never reads it
    try:
        temp.write_text(text, encoding="utf-8")
        os.replace(draft, final)  # the draft moves as it is ...
        try:
            os.replace(temp, final)  # ... then its decided text replaces it
        except OSError:
            os.replace(final, draft)
            raise
    except OSError as exc:
        raise AdrError(f"cannot move the draft to {final}: {exc}", file=str(draft)) from exc
    finally:
        temp.unlink(missing_ok=True)
