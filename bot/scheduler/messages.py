"""What the scheduled jobs say in Slack, kept together so it can be read and improved as prose."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from bot.canary.verdict import Verdict

DRIFT_TITLE = "Baseline drift on {target}: {failures}"
DRIFT_NUMBERS = (
    ":straight_ruler: *Baseline canary* on *{target}* ({load}) against the gates of the ADRs "
    "in force ({adrs}):\n{lines}\nThe diagnosis above was run because of this drift; when a "
    "later canary meets the gates again, this incident resolves by itself."
)
STILL_DRIFTING = (
    ":straight_ruler: Still drifting at {at:%H:%M} UTC (baseline canary, {load}):\n{lines}"
)
RECOVERED = (
    ":white_check_mark: The baseline canary on *{target}* meets the gates again ({load}):\n{lines}"
)
DRAFT_REMINDER = (
    ":hourglass: *{adr}* has waited {age} for review (`{path}`). Reviewers: {reviewers} — "
    "accept or reject the draft with its buttons in this thread, so the next incident has a rule."
)


def gate_lines(verdict: Verdict, setters: Mapping[str, str]) -> str:
    """One line per gate: the measured number, the gate, the ADR that set it, and a mark."""
    return "\n".join(
        f"{':white_check_mark:' if r.passed else ':x:'} {r.shown()} "
        f"(gate {r.bound()}, {setters.get(r.name, 'always on')})"
        for r in verdict.results
    )


def load_text(concurrency: int, num_requests: int, prompt_length: int) -> str:
    """The canary's load in words."""
    return f"{num_requests} requests, {concurrency} at a time, {prompt_length}-token prompts"


def age_text(seconds: float) -> str:
    """'26 h' / '45 min'."""
    return f"{seconds / 3600:.0f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"


def drift_title(target: str, failures: Sequence[str]) -> str:
    """The drift incident's title: which gates drifted, with the numbers."""
    return DRIFT_TITLE.format(target=target, failures="; ".join(failures))


def still_drifting(at: dt.datetime, load: str, lines: str) -> str:
    """A later canary that still misses the gates, in the open incident's thread."""
    return STILL_DRIFTING.format(at=at, load=load, lines=lines)
