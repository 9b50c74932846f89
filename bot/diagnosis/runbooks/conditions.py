"""Conditions over readings: ``probe.reading OP number`` clauses joined by ``and`` / ``or``.

No expressions and no eval(): ``and`` binds tighter than ``or``, there are no parentheses.
Evaluation is three-valued: a clause whose reading was not measured, or whose bound or span does
not decide it (``compare``), is undecided (None); ``and`` is False if any part is False, True if
all are True; ``or`` is True if any part is True, False if all are False; otherwise undecided.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from bot.kernel.numbers import Reading, compare

PROBE = r"[A-Za-z_]\w*"  # a probe's name; ``probe.reading`` names one of its readings
READING_NAME = re.compile(rf"^{PROBE}\.\w+$")
CLAUSE = re.compile(rf"^(?P<probe>{PROBE})\.(?P<reading>\w+) ?(?P<op>[<>]=?|==|!=) ?"
                    r"(?P<value>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)$")  # fmt: skip
JOINERS = ("and", "or")
SHAPE = "`probe.reading OP number`, joined by `and` / `or` (OP one of < <= > >= == !=)"


@dataclass(frozen=True)
class Clause:
    """``reading op limit``, the reading by its dotted name."""

    reading: str
    op: str
    limit: float

    def holds(self, read: Callable[[str], Reading | None]) -> bool | None:
        """True, False, or None when unmeasured or the bound does not decide."""
        value = read(self.reading)
        return None if value is None else compare(value, self.op, Reading(self.limit))


@dataclass(frozen=True)
class RunbookCondition:
    """Alternatives (``or``) of conjunctions (``and``) of clauses."""

    text: str
    alternatives: tuple[tuple[Clause, ...], ...]

    @property
    def readings(self) -> list[str]:
        """The readings it names, in order, once each."""
        names = [c.reading for group in self.alternatives for c in group]
        return list(dict.fromkeys(names))

    def holds(self, read: Callable[[str], Reading | None]) -> bool | None:
        """The three-valued truth of the condition (module docstring)."""
        groups = [_all(c.holds(read) for c in group) for group in self.alternatives]
        if any(g is True for g in groups):
            return True
        return False if all(g is False for g in groups) else None


def _all(values: Iterable[bool | None]) -> bool | None:
    seen = list(values)
    if any(v is False for v in seen):
        return False
    return True if all(v is True for v in seen) else None


def parse(text: str) -> RunbookCondition:
    """Parse a condition; ValueError saying which part is not a clause and what to write.

    Split on whitespace first (linear in the text, however many spaces it holds), then read
    the words between joiners as one clause."""
    groups: list[list[Clause]] = [[]]
    words: list[str] = []
    for word in [*text.split(), "or"]:
        if word not in JOINERS:
            words.append(word)
            continue
        groups[-1].append(clause(" ".join(words), whole=text))
        words = []
        if word == "or":
            groups.append([])
    return RunbookCondition(text.strip(), tuple(tuple(g) for g in groups[:-1]))


def clause(text: str, *, whole: str | None = None) -> Clause:
    """One ``probe.reading OP number`` clause (the one grammar of runbook findings and
    conditions); ValueError saying what to write."""
    m = CLAUSE.match(" ".join(text.split()))
    shown = _short(text.strip() or (whole or text).strip())
    if m is None:
        raise ValueError(f"{shown!r} is not a clause: write {SHAPE}")
    limit = float(m["value"])
    if not math.isfinite(limit):
        raise ValueError(f"{shown!r}: the number is too large to compare with")
    return Clause(f"{m['probe']}.{m['reading']}", m["op"], limit)


def _short(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."
