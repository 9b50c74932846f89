"""Evaluates an ADR's `match` conditions ({metric, op, value}) against a report, without eval.

A report is readings by metric name (bot/adr/metrics.py), each a ``Reading``: a diagnosis hands
its readings over so (``bot.diagnosis.match_readings``); a JSON report on disk (the canary's
``--output-json``, or a diagnosis report with a flat ``metrics`` mapping) is read once by
``read_report``.
A relative value ('3x normal') is multiplied out with the target's normal numbers first; with
no normal for its metric the condition does not hold. A number that is only a bound ('<=' 10 ms,
the histogram's first bucket), the report's or normal's, decides a condition only where the
bound decides it; otherwise the condition is undecided, and does not hold.

An ADR that names the cause it fixes (``cause:``) is then checked against the diagnosis's
verdicts on causes (``by_cause``): offered when one of its causes is supported, not offered when
each is ruled out (with a line saying which number ruled it out), offered on its numbers alone
with a line saying so when the diagnosis could not tell.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from bot.adr.metrics import METRICS
from bot.adr.relative import Relative, no_normal
from bot.adr.workload import WorkloadShape
from bot.adr.workload.diff import diff
from bot.kernel.numbers import Bound, Measured, Reading, bounds_of, compare, sign_of, spans_of

if TYPE_CHECKING:
    from bot.adr.models import Adr, Condition


@dataclass(frozen=True)
class ConditionResult:
    """One condition checked against a report: the value found and whether it holds."""

    metric: str
    op: str
    limit: float | None  # None: a relative limit with no normal to multiply
    value: float | None
    holds: bool
    relative: str | None = None  # '3x normal' when the ADR wrote the limit that way
    decided: bool = True  # False: a bound on either side does not decide it
    value_bound: Bound | None = None
    limit_bound: Bound | None = None
    value_span: tuple[float, float] | None = None

    def explain(self) -> str:
        """E.g. 'ttft_p99_ms 1204.5 > 1000: holds' or 'goodput_ratio not in report'."""
        if self.relative is not None and self.limit is None:
            return f"{self.metric} {self.op} {self.relative}: {no_normal(self.metric)}"
        if self.value is None:
            return f"{self.metric} not in report"
        limit = _with_bound(self.limit, self.limit_bound)
        if self.relative is not None:
            limit = f"{self.relative} (= {limit})"
        value = _with_bound(self.value, self.value_bound, self.value_span)
        text = f"{self.metric} {value} {self.op} {limit}: "
        if not self.decided and self.value_span is not None:
            return text + "undecided (the estimate's span reaches both sides of the limit)"
        if not self.decided:
            return text + "undecided (a histogram bound on one side does not decide it)"
        return text + ("holds" if self.holds else "does not hold")


@dataclass(frozen=True)
class MatchResult:
    """An ADR checked against a report: it matches when it has conditions and all hold."""

    adr: Adr
    conditions: tuple[ConditionResult, ...]

    @property
    def matches(self) -> bool:
        """All conditions hold (an ADR without conditions never matches)."""
        return bool(self.conditions) and all(c.holds for c in self.conditions)


def read_report(report: Mapping[str, Any]) -> Measured:
    """Every known metric a report gives (a canary's ``--output-json`` or a diagnosis report),
    with the bounds and spans it states for them: read once, matched by name after."""
    numbers = {name: value for name in METRICS if (value := read_metric(report, name)) is not None}
    return Measured.of(numbers, bounds_of(report.get("bounds")), spans_of(report.get("spans")))


def read_metric(report: Mapping[str, Any], name: str) -> float | None:
    """The number a report gives for a known metric name, or None when it has none."""
    if name not in METRICS:
        raise KeyError(name)
    flat = report.get("metrics")
    value: object = None
    if isinstance(flat, Mapping) and name in flat:
        value = flat[name]
    else:
        where, _ = METRICS[name]
        value = where(report) if callable(where) else _dig(report, where.split("."))
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


def _dig(data: object, path: Sequence[str]) -> object:
    for key in path:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


def check(
    condition: Condition, report: Measured, normal: Measured | None = None
) -> ConditionResult:
    """Check one condition against a report's readings (``read_report``) and the target's
    normal; a metric the report lacks, or a normal never measured, does not hold."""
    found = report.reading(condition.metric)
    relative, limit_bound = None, None
    if isinstance(condition.value, Relative):
        relative = str(condition.value)
        known = normal or Measured()
        limit = condition.value.of(condition.metric, known.numbers)
        base = known.reading(condition.metric)
        limit_bound = None if base is None else base.bound
    else:
        limit = condition.value
    decided: bool | None = False
    if found is not None and limit is not None:
        decided = compare(found, condition.op, Reading(limit, limit_bound))
    return ConditionResult(
        condition.metric, condition.op, limit, None if found is None else found.value,
        decided is True, relative, decided=decided is not None,
        value_bound=None if found is None else found.bound, limit_bound=limit_bound,
        value_span=None if found is None else found.span,
    )  # fmt: skip


def match(adr: Adr, report: Measured, normal: Measured | None = None) -> MatchResult:
    """Check all of an ADR's conditions against a report (and the target's normal numbers)."""
    return MatchResult(adr, tuple(check(c, report, normal) for c in adr.match))


def matching(
    adrs: Iterable[Adr], report: Measured, normal: Measured | None = None
) -> list[MatchResult]:
    """The accepted ADRs whose conditions all hold for the report, in the order given."""
    results = (match(adr, report, normal) for adr in adrs if adr.status == "accepted")
    return [r for r in results if r.matches]


def _with_bound(
    value: float | None, bound: Bound | None, span: tuple[float, float] | None = None
) -> str:
    """'71', '≤ 10' (a bound), '0.12 (0-0.24)' (an estimate; in the condition's own unit)."""
    if bound is not None:
        return f"{sign_of(bound)} {value:g}"
    if span is not None:
        return f"{value:g} ({span[0]:g}-{span[1]:g})"
    return f"{value:g}"


class CauseState(Protocol):
    """A diagnosis's verdict on one cause, as ``by_cause`` reads it (the diagnosis's
    ``CauseVerdict``, or a stored summary's ``causes`` entry,
    ``bot.kernel.store.summary.CauseEntry``)."""

    @property
    def cause(self) -> str: ...
    @property
    def verdict(self) -> str: ...  # supported | ruled_out | cannot_tell
    @property
    def number(self) -> str | None: ...
    @property
    def missing(self) -> Sequence[str]: ...


def supported_causes(verdicts: Iterable[CauseState]) -> list[str]:
    """The causes a diagnosis supports, in its order."""
    return [v.cause for v in verdicts if v.verdict == "supported"]


def by_cause(
    results: Iterable[MatchResult], verdicts: Iterable[CauseState]
) -> tuple[list[MatchResult], list[str]]:
    """The matches to offer and a line per ADR whose cause the diagnosis did not support.

    An ADR without ``cause:`` is offered as its numbers say. One with causes is offered when
    one of them is supported; not offered when every one is ruled out ("ADR-X answers
    kv_cache_pressure, ruled out: 12 % of the KV cache in use"); offered on its numbers alone
    otherwise (a missing reading must not hide a pre-approved fix), with a line when the
    diagnosis tested a cause and could not tell (silent when its runbook tests none of them)."""
    by_name = {v.cause: v for v in verdicts}
    offered: list[MatchResult] = []
    lines: list[str] = []
    for result in results:
        causes = result.adr.cause
        states = [by_name.get(name) for name in causes]
        if not causes or any(s is not None and s.verdict == "supported" for s in states):
            offered.append(result)
        elif all(s is not None and s.verdict == "ruled_out" for s in states):
            lines.append(f"{result.adr.id} answers {_ruled_out(causes, states)}")
        else:
            offered.append(result)
            if any(s is not None for s in states):
                lines.append(f"{result.adr.id} answers {_untold(causes, states)}")
    return offered, lines


def _ruled_out(causes: Sequence[str], states: Sequence[CauseState | None]) -> str:
    return "; ".join(
        f"{name}, ruled out" + (f": {s.number}" if s is not None and s.number else "")
        for name, s in zip(causes, states, strict=True)
    )


def _untold(causes: Sequence[str], states: Sequence[CauseState | None]) -> str:
    """'queueing: cannot tell (no vllm_metrics.queue_ttft_share); offered on its numbers'."""
    parts = []
    for name, s in zip(causes, states, strict=True):
        if s is None:
            parts.append(f"{name}: not tested by this runbook")
        elif s.verdict == "cannot_tell":
            missing = f" (no {', '.join(s.missing)})" if s.missing else ""
            parts.append(f"{name}: cannot tell{missing}")
        else:
            parts.append(f"{name}, ruled out" + (f": {s.number}" if s.number else ""))
    return "; ".join(parts) + "; offered on its numbers alone"


def by_workload(
    results: Iterable[MatchResult], live: WorkloadShape | None, unknown: str = ""
) -> tuple[list[MatchResult], list[str]]:
    """The matches to offer and a line per ADR left out, or offered unchecked, for its workload.

    A rule that records the workload it was proven on (``workload:``) answers that traffic: it
    is offered when production's, captured in the diagnosis window (``live``), is alike in what
    the requests are (prompt and output lengths, prefix-cache hits; not the rate, as an incident
    is often a surge of the very traffic), and not when a dimension drifted, the line saying
    which ("ADR-X was proven on another workload: prefix-cache hit rate 2% -> 88%: DRIFTED").
    With no live shape (``unknown`` says why) it is offered on its numbers, the line saying so.
    A rule without a workload is offered as its numbers say."""
    offered: list[MatchResult] = []
    lines: list[str] = []
    for result in results:
        proven = result.adr.workload
        if proven is None:
            offered.append(result)
        elif live is None:
            offered.append(result)
            why = f": {unknown}" if unknown else ""
            lines.append(
                f"{result.adr.id}: production's workload not compared with the one it was"
                f" proven on{why}; offered on its numbers alone"
            )
        else:
            moved = [d.line for d in diff(proven, live, rate=False).dimensions if d.drifted]
            if moved:
                lines.append(
                    f"{result.adr.id} not offered: proven on another workload ({'; '.join(moved)})"
                )
            else:
                offered.append(result)
    return offered, lines
