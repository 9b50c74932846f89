"""What a diagnosis is made of: the four numbers, the baseline the accepted ADRs set, findings."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bot.adr import Adr, MatchResult, Normal
from bot.adr.workload import WorkloadShape
from bot.diagnosis.causes import CauseVerdict
from bot.diagnosis.chart_data import ChartData
from bot.diagnosis.probes.sampling import SampledWindow
from bot.diagnosis.probes.types import Finding
from bot.diagnosis.replica_text import summary_json
from bot.diagnosis.replicas import FleetVerdict
from bot.kernel.numbers import FOUR, Measured, catalogue
from bot.kernel.store import DiagnosisSummary

GATE_OF = catalogue.GATE_OF  # metric -> the gate that limits it


@dataclass(frozen=True)
class Limit:
    """One baseline number and the ADR that set it."""

    value: float
    adr_id: str


@dataclass(frozen=True)
class Baseline:
    """The strictest gate each accepted ADR sets for each of the four numbers."""

    limits: Mapping[str, Limit] = field(default_factory=dict)

    @classmethod
    def from_adrs(cls, adrs: Iterable[Adr], before: Normal | None = None) -> Baseline:
        """Strictest limit per number over the accepted ADRs' gates (lowest max, highest min).

        A gate written 'Nx before' counts as N times ``before`` (the before-run of the change
        that put the ADR in force) and sets no limit without it; one written 'Nx normal' never
        does: it would compare the canary with the engine's histograms (``relative.unlike_gate``).
        """
        limits: dict[str, Limit] = {}
        for adr in adrs:
            if adr.status != "accepted" or adr.gates is None:
                continue
            gates = adr.gates.resolve({}, before=before, strict=False)
            for key, _, _, worse_up in FOUR:
                value = getattr(gates, GATE_OF[key])
                if value is None:  # unset, or relative to nothing measured
                    continue
                held = limits.get(key)
                stricter = held is None or (value < held.value if worse_up else value > held.value)
                if stricter:
                    limits[key] = Limit(float(value), adr.id)
        return cls(limits)

    def verdict(self, key: str, value: float | None) -> bool | None:
        """True within the baseline, False outside it, None when unknown or unmeasured."""
        limit = self.limits.get(key)
        if limit is None or value is None:
            return None
        worse_up = next(w for k, _, _, w in FOUR if k == key)
        return value <= limit.value if worse_up else value >= limit.value


@dataclass(frozen=True)
class Diagnosis:
    """One finished diagnosis of one target."""

    target: str
    runbook: str
    headline: Measured  # the four numbers, the engine's
    baseline: Baseline
    findings: list[Finding]
    matches: list[MatchResult]
    readings: Measured  # every reading by `probe.reading`
    details: Mapping[str, Any]
    sampling_s: float
    at: dt.datetime
    window: SampledWindow | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    normal: Measured = field(default_factory=Measured)  # the median of the snapshots
    chart: ChartData | None = None  # what the chart shows (kept: the incident page draws it)
    replicas: FleetVerdict | None = None  # one replica or all of them (None: one engine)
    withheld: list[MatchResult] = field(default_factory=list)  # matched, not offered (outlier)
    causes: list[CauseVerdict] = field(default_factory=list)  # supported, ruled out, cannot tell
    workload: WorkloadShape | None = None  # production's in the window (rules are matched by it)

    def summary(self) -> DiagnosisSummary:
        """The headline and every reading, as the store and the audit log keep them."""
        headline, readings, normal = self.headline.json(), self.readings.json(), self.normal.json()
        return DiagnosisSummary.of(
            {
                "target": self.target,
                "runbook": self.runbook,
                "headline": headline["numbers"],
                "baseline": {k: (v.value, v.adr_id) for k, v in self.baseline.limits.items()},
                "worst": str(max((f.severity for f in self.findings), default="ok")),
                "matches": [m.adr.id for m in self.matches],
                "timings_s": {k: round(v, 3) for k, v in self.timings.items()},
                "readings": readings["numbers"],
                "normal": normal["numbers"],
                "bounds": headline["bounds"],
                "spans": headline["spans"],
                "reading_bounds": readings["bounds"],
                "reading_spans": readings["spans"],
                "normal_bounds": normal["bounds"],
                "normal_spans": normal["spans"],
                "findings": [(str(f.severity), f.message, f.source) for f in self.findings[:50]],
                "chart": None if self.chart is None else self.chart.to_json(),
                "replicas": None if self.replicas is None else summary_json(self.replicas),
                "withheld_matches": [m.adr.id for m in self.withheld],
                "causes": [c.to_json() for c in self.causes],
            }
        )


def summary_numbers(summary: DiagnosisSummary, which: str = "headline") -> Measured:
    """The numbers of a stored summary (``Diagnosis.summary()``) with their bounds and spans:
    ``which`` is "headline" (the incident), "normal" (the target's normal) or "readings"
    (every reading, by `probe.reading`)."""
    if which == "headline":
        return Measured.from_json(summary.headline, summary.bounds, summary.spans)
    if which == "readings":
        return Measured.from_json(summary.readings, summary.reading_bounds, summary.reading_spans)
    return Measured.from_json(summary.normal, summary.normal_bounds, summary.normal_spans)
