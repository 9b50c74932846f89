"""Review of ADR drafts: who may review, and what a decided draft becomes.

``decided`` is the record a decision makes of a draft (its status, the reviewer among the
deciders, the review noted under its own heading), checked as the validator checks; the bot
writes it into the store in the decision's transaction (bot.postmortem.records).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from bot.adr import Adr, Status, check_record
from bot.kernel import AdrError, NotAllowed, UsageError
from bot.kernel.runtime import who_may

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
