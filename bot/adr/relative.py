"""Values relative to a target's measured normal: `3x normal` in an ADR's `match` and `gates`.

An absolute number (`tpot_p99_ms > 300`) is true on one machine and false on the next; a
multiple of what the target measures on a normal day (`tpot_p99_ms > 3x normal`) says the same
thing on every machine. "Normal" is the median of the scheduler's four-metric snapshots of the
target (``bot.scheduler.snapshots.NormalReader``), so only those four metrics can be relative.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from bot.errors import UsageError

# The numbers a snapshot keeps (bot.scheduler.snapshots.KEYS): what "normal" can be taken of.
NORMAL_METRICS = ("ttft_p99_ms", "tpot_p99_ms", "goodput_ratio", "kv_fragmentation")
_RELATIVE = re.compile(r"^\s*(?P<factor>\d+(?:\.\d+)?)\s*x\s+normal\s*$")
SYNTAX = "a number (e.g. 300 or 0.95) or a multiple of the target's normal written like '3x normal'"

Normal = Mapping[str, float | None]


class NoNormal(UsageError):
    """A relative value needs the target's normal for a metric that was never measured."""


@dataclass(frozen=True)
class Relative:
    """`factor` times the target's normal value of the metric it is compared with."""

    factor: float

    def __str__(self) -> str:
        return f"{self.factor:g}x normal"

    def of(self, metric: str, normal: Normal) -> float | None:
        """The absolute value against ``normal``; None when no normal was measured for it."""
        base = normal.get(metric)
        if base is None or not math.isfinite(base):
            return None
        return self.factor * base


def parse_value(value: object) -> float | Relative:
    """A number as float, or '3x normal' as Relative; anything else is a ValueError saying why."""
    if isinstance(value, Relative):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite number; use {SYNTAX}")
        return float(value)
    if isinstance(value, str) and (m := _RELATIVE.match(value)):
        factor = float(m["factor"])
        if factor <= 0:
            raise ValueError(f"{value!r}: the multiple of normal must be greater than 0")
        return Relative(factor)
    hint = " (write the number without quotes)" if _is_number(value) else ""
    raise ValueError(f"{value!r} is not {SYNTAX}{hint}")


def dump_value(value: float | Relative) -> float | str:
    """The front-matter form: the number, or '3x normal'."""
    return str(value) if isinstance(value, Relative) else value


def no_normal(metric: str) -> str:
    """Why a relative value cannot be used yet (the same words in matching, gates and docs)."""
    return f"no normal measured for {metric}"


def _is_number(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True
