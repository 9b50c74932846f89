"""How the causes read, on every surface (Slack's root and findings messages, the incident page,
the console): the likely cause first with its one number, then what was ruled out, each with its
number, then the data gaps and what to do about them. Plain text: callers escape for their surface.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bot.diagnosis.causes import CauseVerdict, data_gaps, likely

NONE_STOOD_OUT = "no cause stood out"


def root_line(verdicts: Sequence[CauseVerdict]) -> str:
    """'likely cause: <title> — <number>', or that none stood out."""
    top = likely(verdicts)
    if top is None:
        return NONE_STOOD_OUT
    return f"likely cause: {top.title}" + (f" — {top.number}" if top.number else "")


@dataclass(frozen=True)
class CauseLines:
    """The findings message's cause part: supported (title, evidence), ruled out (title,
    number), undecided (title, why) and data gaps (what to do)."""

    supported: list[tuple[str, str]]
    ruled_out: list[tuple[str, str]]
    undecided: list[tuple[str, str]]
    gaps: list[str]


def lines(verdicts: Sequence[CauseVerdict]) -> CauseLines:
    """The verdicts grouped as the thread and the page list them."""
    return CauseLines(
        supported=[(v.title, v.evidence) for v in verdicts if v.verdict == "supported"],
        ruled_out=[(v.title, v.number or v.evidence) for v in verdicts if v.verdict == "ruled_out"],
        undecided=[(v.title, v.evidence) for v in verdicts if v.verdict == "cannot_tell"],
        gaps=data_gaps(verdicts),
    )


def plain_text(verdicts: Sequence[CauseVerdict]) -> list[str]:
    """The cause part as plain lines (the console, logs)."""
    part = lines(verdicts)
    out = [root_line(verdicts)]
    out += [f"supported: {title}: {evidence}" for title, evidence in part.supported]
    out += [f"ruled out: {title} ({number})" for title, number in part.ruled_out]
    out += [f"cannot tell: {title} ({why})" for title, why in part.undecided]
    out += [f"data gap: {gap}" for gap in part.gaps]
    return out
