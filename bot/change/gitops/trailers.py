"""Commit messages that explain themselves to people and identify themselves to ruleloop.

Each commit ruleloop makes says in its subject what it does (``ADR-20260831-01 on prod-a:
--max-num-batched-tokens=2048``, ``ruleloop: revert ADR-... on prod-a``) and carries git
trailers, so that a bot restarted on another replica finds its own commits in the history
(never by sha alone: a forge's rebase merge gives the landed commit a new sha):

    Ruleloop-Change: remediation-42        the change (the same on every commit of it)
    Ruleloop-Target: prod-a                the target whose flags it changes
    Ruleloop-Stage: canary | main          which locator's file it changes
    Ruleloop-Flags: {"max-num-batched-tokens": 2048}
    Ruleloop-Revert-Of: <sha>              on a revert: the commit it reverts (one per commit)
    Ruleloop-Adr: ADR-20260831-01          on an ADR published by ruleloop
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

CHANGE = "Ruleloop-Change"
TARGET = "Ruleloop-Target"
STAGE = "Ruleloop-Stage"
FLAGS = "Ruleloop-Flags"
REVERT_OF = "Ruleloop-Revert-Of"
ADR = "Ruleloop-Adr"


def one_line(text: str, *, limit: int = 200) -> str:
    """``text`` on one line (a subject or a trailer value cannot span lines)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def compose(subject: str, body: str, trailers: Sequence[tuple[str, str]]) -> str:
    """A commit message: the subject line, the body, then the trailers as git reads them
    (the last paragraph, ``Key: value`` lines)."""
    parts = [one_line(subject, limit=100)]
    if body.strip():
        parts.append(body.strip())
    parts.append("\n".join(f"{key}: {one_line(value, limit=500)}" for key, value in trailers))
    return "\n\n".join(parts) + "\n"


def parse(block: str) -> dict[str, list[str]]:
    """The trailers of ``git log --format=%(trailers:only,unfold)``, by key."""
    found: dict[str, list[str]] = {}
    for line in block.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and " " not in key.strip():
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def flags_value(flags: Mapping[str, Any]) -> str:
    """The Ruleloop-Flags trailer's value: the flags a commit sets, as one line of JSON."""
    return json.dumps(dict(flags), sort_keys=True)


def read_flags_value(value: str) -> dict[str, Any]:
    """The inverse of ``flags_value`` (an unreadable value reads as no flags)."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
