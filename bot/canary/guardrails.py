"""Guardrails: what a change did to the numbers no gate names.

A change is kept when it meets its ADR's gates; a fix that halves TPOT may double TTFT, and a
gate on TPOT alone keeps it silently. Every headline number and the error rate are compared
between the before-run and the canary of the same change (the same canary, same target, same
workload), gated or not:

* TTFT and TPOT p99: a one-sided U test on per-request values (``bot.canary.stats.judge_ratio``)
  of "the canary is above (1 + band) x the before-run": worse beyond noise only when significant
  at the gates' confidence. Worse on the point p99 but not significant is said as not decided.
* Error rate: the same test on each request's failed-or-not, worse only when significant and
  more than ``band`` of the before-run's rate and one point of a percent higher.
* Goodput and KV fragmentation are ratios of the whole run (no per-request values): a point
  change beyond ``band`` is said with "no test" beside it, never as significant.

A gated number is judged by its gate, not here. ``Watch.regressed`` is what the target's
``guardrails = "block"`` rolls back on; ``"warn"`` (the default) says it on the card and in the
thread.

The target's standing gates (the accepted ADRs in force on it, such as a team's latency SLO)
are guardrails too (``standing``): the change's canary is judged by them with the same judge as
a gate (``bot.canary.verdict.judged``), and a standing gate it misses (decided: a p99 whose
interval lies over the limit; a whole-run ratio on its value) counts as ``regressed``. One the
canary is too short to decide is said as not decided, never as met.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from bot.adr import AdrGates
from bot.canary.schema import CanaryReport
from bot.canary.stats import DEFAULT_CONFIDENCE, judge_ratio, u_test_values
from bot.canary.verdict import GateResult, Gates, judged
from bot.kernel.numbers import catalogue, compact

BAND = 0.2  # worse by more than this share of the before-run's value, and significant
SAMPLED = {"ttft_p99_ms": "ttft_ms", "tpot_p99_ms": "tpot_ms"}  # number -> per-request values
POINT = ("goodput_ratio", "kv_fragmentation")  # whole-run ratios: no per-request test
MIN_ERROR_RISE = 0.01  # an error rate rises by at least a point of a percent to count


@dataclass(frozen=True)
class Watch:
    """One ungated number, before and after: worse beyond the band on its point values
    (``worse``), and worse beyond noise (``regressed``: significant, where it can be tested)."""

    key: str  # a catalogue key, or "error_rate"
    before: float | None
    after: float | None
    worse: bool
    regressed: bool
    tested: bool
    evidence: str  # 'p=0.0003; n=8, 8 before' or 'no test: a whole-run ratio'
    band: float = BAND

    def text(self) -> str:
        """'TTFT p99 248ms → 495ms (2.0x): worse beyond 20% and noise (above 1.2x before at 99%:
        p=0.0003; n=8, 8 before)', '... held within 20% ...', '... worse by more than 20%, not
        beyond noise ...'."""
        label, unit = _label_unit(self.key)
        was, now = compact(self.before, unit), compact(self.after, unit)
        times = ""
        if self.before and self.after is not None and self.before > 0:
            times = f" ({self.after / self.before:.1f}x)"
        band = f"{self.band:.0%}"
        if self.regressed:
            word = f"worse beyond {band} and noise"
        elif self.worse:
            word = f"worse by more than {band}" + (", not beyond noise" if self.tested else "")
        else:
            word = f"held within {band}"
        return f"{label} {was} → {now}{times}: {word} ({self.evidence})"


@dataclass(frozen=True)
class StandingGate:
    """A standing gate of the target: its limit and the accepted ADR in force there that set it."""

    limit: float
    adr_id: str


@dataclass(frozen=True)
class Standing:
    """A standing gate of the target (set by the ADR ``adr_id``, in force there) on the
    change's canary: missed (``regressed``), over its limit on the point value but not decided
    (``worse``), or held."""

    result: GateResult  # as the verdict judged it, statistics and all
    adr_id: str

    @property
    def regressed(self) -> bool:
        """Missed: decided by its statistics, or (a whole-run ratio) on its value."""
        r = self.result
        return r.decided == "missed" or (r.decided is None and not r.passed)

    @property
    def worse(self) -> bool:
        """Missed, or over the limit on the point value (not decided)."""
        r = self.result
        if self.regressed:
            return True
        if r.decided != "inconclusive" or r.value is None:
            return False
        return r.value > r.limit if r.name.startswith("max_") else r.value < r.limit

    def text(self) -> str:
        """'TTFT p99 452ms over the standing gate ≤ 350ms (ADR-20260831-01): missed (p99 in
        [410, 460] at 99% (n=528): not ≤ 350)'."""
        r = self.result
        if self.regressed:
            word = "missed"
        elif self.worse:
            word = "over it, not decided"
        else:
            word = "held" if r.decided in (None, "met") else "not decided"
        why = r.judgement.why if r.judgement is not None else r.reason
        return f"{r.shown()} against the standing gate {r.bound()} ({self.adr_id}): {word} ({why})"


def standing(
    report: CanaryReport,
    limits: Mapping[str, StandingGate],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
) -> list[Standing]:
    """The canary ``report`` judged by the target's standing gates: ``limits`` maps a gate
    name ('max_ttft_p99_ms') to its limit and the ADR that set it."""
    if not limits:
        return []
    numbers = AdrGates.of_numbers({name: gate.limit for name, gate in limits.items()})
    results = judged(report, Gates(numbers, confidence=confidence)).verdict.results
    return [Standing(r, limits[r.name].adr_id) for r in results if r.name in limits]


Guardrail = Watch | Standing  # what the card, the record and "block" read alike


def _label_unit(key: str) -> tuple[str, str]:
    if key == "error_rate":
        return "error rate", "ratio"
    metric = catalogue.BY_KEY[key]
    return metric.phrase, metric.unit


def watch(
    before: CanaryReport,
    after: CanaryReport,
    *,
    gated: Collection[str] = (),
    band: float = BAND,
    confidence: float = DEFAULT_CONFIDENCE,
) -> list[Watch]:
    """Every headline number and the error rate of ``after`` against ``before``, except those
    ``gated`` (catalogue keys a gate judged): which got worse beyond ``band``, and which of
    those beyond noise (``regressed``)."""
    out = []
    for key, field in SAMPLED.items():
        if key in gated:
            continue
        was, now = before.samples.values(field), after.samples.values(field)
        if not was or not now:
            continue
        judgement = judge_ratio(was, now, 1 + band, confidence=confidence)
        point_b, point_a = _p99(before, key), _p99(after, key)
        regressed = judgement.outcome == "missed"
        worse = regressed or (
            point_b is not None and point_a is not None and point_a > (1 + band) * point_b
        )
        said = {"missed": "above", "met": "under"}.get(judgement.outcome)
        test = f"{said} {1 + band:g}x before" if said else "not decided"
        evidence = (
            f"{test} at {confidence:.0%}: p={judgement.p_value:.2g};"
            f" n={judgement.n}, {judgement.n_before} before"
        )
        out.append(Watch(key, point_b, point_a, worse, regressed, True, evidence, band))
    errors = _error_watch(before, after, band, confidence)
    if errors is not None:
        out.append(errors)
    for key in POINT:
        if key in gated:
            continue
        was_v, now_v = _point(before, key), _point(after, key)
        if was_v is None or now_v is None:
            continue
        change = (now_v - was_v) if catalogue.BY_KEY[key].worse_up else (was_v - now_v)
        worse = was_v > 0 and change > band * was_v
        untested = "no test: a whole-run ratio"
        out.append(Watch(key, was_v, now_v, worse, False, False, untested, band))
    return out


def _error_watch(
    before: CanaryReport, after: CanaryReport, band: float, confidence: float
) -> Watch | None:
    """The error rate, tested on each request's failed-or-not (a U test on 0s and 1s)."""
    b, a = before.requests, after.requests
    if not b.total or not a.total:
        return None
    was, now = b.failed / b.total, a.failed / a.total
    worse = now > was + MIN_ERROR_RISE and now > (1 + band) * was
    test = u_test_values(
        [1.0] * a.failed + [0.0] * (a.total - a.failed),
        [1.0] * b.failed + [0.0] * (b.total - b.failed),
    )
    regressed = worse and test.p_value < 1 - confidence
    if not a.failed and not b.failed:
        evidence = f"no failed request either side; n={a.total}, {b.total} before"
    else:
        said = "more at" if regressed else "not more at"
        evidence = f"{said} {confidence:.0%}: p={test.p_value:.2g}; n={a.total}, {b.total} before"
    return Watch("error_rate", was, now, worse, regressed, True, evidence, band)


def _p99(report: CanaryReport, key: str) -> float | None:
    spread = report.ttft_ms if key == "ttft_p99_ms" else report.tpot_ms
    value = spread.p99_judged()
    return value if value is not None and math.isfinite(value) else None


def _point(report: CanaryReport, key: str) -> float | None:
    if key == "goodput_ratio":
        return report.goodput_ratio
    return report.kv_fragmentation.observed
