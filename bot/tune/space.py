"""The search space of `ruleloop tune`: per tunable flag, the values a search may give it.

A plan declares each dimension as a list of values or as an integer range with a step:

    space:
      max-num-seqs: {values: [4, 8, 16, 32]}
      max-num-batched-tokens: {low: 256, high: 2048, step: 256}
      enable-prefix-caching: {values: [true, false]}

Only flags on the tunable-flag allowlist (``bot.adr.flags``) may be searched, and every value is
checked against the flag's type and range before any engine starts. The space is always finite:
that is what lets a search say it has measured every point, and what a grid enumerates.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from bot.adr import TUNABLE, EngineValue, canonical, check_engine_args
from bot.kernel import UsageError

Flags = dict[str, EngineValue]
Key = tuple[tuple[str, EngineValue], ...]
MAX_POINTS = 1_000_000  # a larger space is a typo (a step of 1 over a token budget)
MAX_VALUES = 10_000  # values of one flag, likewise


class SearchDimension(BaseModel):
    """One flag's values: ``values: [...]``, or ``low``/``high`` (integers) with ``step``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    values: list[EngineValue] | None = Field(default=None, min_length=1)
    low: int | None = None
    high: int | None = None
    step: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _values_or_range(self) -> SearchDimension:
        ranged = self.low is not None or self.high is not None
        if self.values is not None and ranged:
            raise ValueError("give values: or low:/high:, not both")
        if self.values is None and not ranged:
            raise ValueError("give values: [a, b, ...] or low: and high: (integers, with step:)")
        if ranged and (self.low is None or self.high is None):
            raise ValueError("a range needs both low: and high:")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")
        if self.values is not None and len(set(map(repr, self.values))) != len(self.values):
            raise ValueError(f"values repeat: {self.values}")
        return self

    def count(self) -> int:
        """How many values (without listing a range's)."""
        if self.values is not None:
            return len(self.values)
        assert self.low is not None and self.high is not None
        return len(range(self.low, self.high + 1, self.step))

    def points(self) -> list[EngineValue]:
        """Every value of this dimension, in order (a range: low, low+step, ... up to high)."""
        if self.values is not None:
            return list(self.values)
        assert self.low is not None and self.high is not None
        return list(range(self.low, self.high + 1, self.step))

    def describe(self) -> str:
        """'{4, 8, 16}' or '256..2048 step 256'."""
        if self.values is not None:
            return "{" + ", ".join(_text(v) for v in self.values) + "}"
        return f"{self.low}..{self.high}" + (f" step {self.step}" if self.step != 1 else "")


@dataclass(frozen=True)
class Space:
    """The checked space: flag -> its values, in the plan's order."""

    dimensions: dict[str, SearchDimension]

    @property
    def flags(self) -> list[str]:
        """The searched flags, in the plan's order."""
        return list(self.dimensions)

    @property
    def size(self) -> int:
        """How many flag sets the space holds (what a full grid measures)."""
        return math.prod(d.count() for d in self.dimensions.values())

    def grid(self) -> Iterator[Flags]:
        """Every flag set, the first flag varying slowest (the order a grid measures them)."""
        names = self.flags
        for combo in itertools.product(*(self.dimensions[n].points() for n in names)):
            yield dict(zip(names, combo, strict=True))

    def key(self, flags: Mapping[str, EngineValue]) -> Key:
        """What makes two flag sets the same point (for dedupe): the values, in flag order.

        ``True`` and ``1`` are different values here (``repr``-distinct), as they are to vLLM.
        """
        return tuple((name, flags[name]) for name in self.flags)

    def describe(self) -> str:
        """The space in one line: 'max-num-seqs {4, 8}; max-num-batched-tokens 256..2048 step
        256 (16 flag sets)'."""
        parts = [f"{name} {d.describe()}" for name, d in self.dimensions.items()]
        return "; ".join(parts) + f" ({self.size} flag sets)"


def build_space(raw: Mapping[str, SearchDimension], *, source: str = "plan") -> Space:
    """The checked space; UsageError naming the flag and why (a flag off the allowlist, a
    value out of the flag's range, a range on a flag that is not an integer)."""
    if not raw:
        raise UsageError(f"{source}: space: give at least one flag to search")
    dims: dict[str, SearchDimension] = {}
    for name, dim in raw.items():
        flag = canonical(name.lstrip("-"))
        where = f"{source}: space.{name}"
        if name.startswith("-"):
            raise UsageError(f"{where}: write the flag without dashes in front: {flag!r}")
        spec = TUNABLE.get(flag)
        if spec is None:
            raise UsageError(
                f"{where}: {name!r} is not a tunable flag, so it cannot be searched; "
                f"allowed: {', '.join(TUNABLE)}"
            )
        if flag in dims:
            raise UsageError(f"{where}: {flag} is in the space twice")
        if dim.low is not None and spec.kind != "int":
            raise UsageError(
                f"{where}: {flag} is {spec.describe()}: a low/high range is for integer flags; "
                "list its values instead (values: [...])"
            )
        if dim.count() > MAX_VALUES:
            raise UsageError(
                f"{where}: {dim.count():,} values is more than {MAX_VALUES:,}; use a coarser "
                "step (a search measures a few dozen flag sets at most)"
            )
        for value in dim.points():
            problems = check_engine_args({flag: value})
            if problems:
                raise UsageError(f"{where}: {problems[0][1]}")
        dims[flag] = dim
    space = Space(dims)
    if space.size > MAX_POINTS:
        raise UsageError(
            f"{source}: space: {space.size:,} flag sets is more than {MAX_POINTS:,}; use "
            "coarser steps (a search measures a few dozen at most)"
        )
    return space


def parse_dimension(text: str) -> tuple[str, SearchDimension]:
    """A dimension from the command line: ``FLAG=4,8,16`` or ``FLAG=256..2048/256``."""
    name, sep, spec = text.partition("=")
    if not sep or not name or not spec:
        raise UsageError(
            f"--space {text!r}: write FLAG=V1,V2,... or FLAG=LOW..HIGH/STEP, "
            "e.g. max-num-seqs=4,8,16 or max-num-batched-tokens=256..2048/256"
        )
    flag = canonical(name.strip().lstrip("-"))
    low, dots, rest = spec.partition("..")
    try:
        if dots:
            high, _, step = rest.partition("/")
            return flag, SearchDimension(low=int(low), high=int(high), step=int(step or 1))
        return flag, SearchDimension(values=[_value(flag, part) for part in spec.split(",")])
    except ValidationError as exc:
        raise UsageError(f"--space {text!r}: {exc.errors()[0]['msg']}") from None
    except ValueError as exc:
        raise UsageError(f"--space {text!r}: {exc}") from None


def _value(flag: str, raw: str) -> EngineValue:
    raw = raw.strip()
    spec = TUNABLE.get(flag)
    kind = spec.kind if spec else "choice"
    if kind == "bool":
        if raw.lower() not in ("true", "false"):
            raise ValueError(f"{flag} takes true or false, not {raw!r}")
        return raw.lower() == "true"
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    return raw


def _text(value: EngineValue) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def flags_text(flags: Mapping[str, EngineValue], order: Sequence[str] | None = None) -> str:
    """'max-num-seqs=8 block-size=32' for progress lines and the matrix's notes."""
    names = list(order) if order is not None else list(flags)
    return " ".join(f"{n}={_text(flags[n])}" for n in names if n in flags)
