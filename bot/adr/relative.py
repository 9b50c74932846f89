"""Values relative to a measurement of the same kind: `3x normal` in a match, `0.5x before` in a
gate.

An absolute number (`tpot_p99_ms > 300`) is true on one machine and false on the next; a multiple
of a number measured the same way on the same target says the same thing on every machine. The
rule is like for like: a relative value multiplies a number of the same source and workload as
the number it is compared with.
- `Nx normal` (match conditions): the diagnosis's engine-window numbers against the median of
  the scheduler's engine-window snapshots of the target (``bot.diagnosis.normal``).
- `Nx before` (gates): the gate canary's client-side numbers against the before-run, the same
  canary on the same target on the flags serving before the change.
A gate written `Nx normal` would compare the canary's client-side numbers under its own workload
with the engine's histograms under whatever production sent: `adr validate` refuses it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from bot.kernel import UsageError
from bot.kernel.numbers import catalogue

# What "normal" can be taken of: the numbers a snapshot keeps (the catalogue says which).
NORMAL_METRICS = catalogue.NORMAL_KEYS
_RELATIVE = re.compile(r"^\s*(?P<factor>\d+(?:\.\d+)?)\s*x\s+(?P<base>normal|before)\s*$")
SYNTAX = (
    "a number (e.g. 300 or 0.95), a multiple of the target's normal written like '3x normal' "
    "(match conditions) or of the before-run written like '0.5x before' (gates)"
)
NORMAL, BEFORE = "normal", "before"

Normal = Mapping[str, float | None]


class NoNormal(UsageError):
    """A relative value needs the target's normal for a metric that was never measured."""


@dataclass(frozen=True)
class Relative:
    """`factor` times a measured value of the metric it is compared with: the target's normal
    (``base`` "normal") or the before-run of the same canary (``base`` "before")."""

    factor: float
    base: str = NORMAL

    def __str__(self) -> str:
        return f"{self.factor:g}x {self.base}"

    def of(self, metric: str, numbers: Normal) -> float | None:
        """The absolute value against ``numbers`` (of this base); None when it has none."""
        base = numbers.get(metric)
        if base is None or not math.isfinite(base):
            return None
        return self.factor * base


def parse_value(value: object) -> float | Relative:
    """A number as float, or '3x normal' as Relative; anything else is a ValueError saying why."""
    if isinstance(value, Relative):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = _finite(value)
        if number is None:
            raise ValueError(f"{_short(value)} is not a finite number; use {SYNTAX}")
        return number
    if isinstance(value, str) and (m := _RELATIVE.match(value)):
        factor = _finite(m["factor"])
        if factor is None:
            raise ValueError(f"{_short(value)}: the multiple is too large to be a number")
        if factor <= 0:
            raise ValueError(f"{value!r}: the multiple of normal must be greater than 0")
        return Relative(factor, m["base"])
    hint = " (write the number without quotes)" if _is_number(value) else ""
    raise ValueError(f"{_short(value)} is not {SYNTAX}{hint}")


def _finite(value: int | float | str) -> float | None:
    """``value`` as a finite float; None for one too large (a 400-digit integer) or inf/nan."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _short(value: object) -> str:
    """A value as an error message quotes it: at most 60 characters of its repr."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**40 else "an integer"
    return text if len(text) <= 60 else text[:57] + "..."


def dump_value(value: float | Relative) -> float | str:
    """The front-matter form: the number, or '3x normal'."""
    return str(value) if isinstance(value, Relative) else value


def no_normal(metric: str) -> str:
    """Why a relative value cannot be used yet (the same words in matching, gates and docs)."""
    return f"no normal measured for {metric}"


def unlike_gate(gate: str, value: Relative) -> str:
    """Why a gate may not be relative to normal: it would compare numbers measured differently."""
    return (
        f"{gate} is '{value}': a gate reads the canary's client-side p99 under the target's canary "
        "workload, while normal is the engine's histogram over the scheduler's snapshot windows "
        "(another source, another workload), so the two are not comparable. Write it relative to "
        f"the before-run of the same canary ('{_before_example(gate)}') or as a number"
    )


def _before_example(gate: str) -> str:
    return "0.5x before" if gate.startswith("max_") else "1x before"


def _is_number(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True
