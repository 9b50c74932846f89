"""An incident's last diagnosis as the store keeps it: one pydantic model, parsed once.

``bot.diagnosis.models.Diagnosis.summary()`` makes it; the ``incidents.summary`` column holds its
JSON and hands it back as this model (``SummaryColumn``), so every reader (the Slack views, the
incident page, the draft, the cause memory and stats, the root message's state) reads fields,
never keys. A part an earlier release wrote in another shape is dropped with a warning, the rest
kept: one odd row never takes a page or a thread down.

The numbers stay JSON-native here (the store sits below the number types);
``bot.diagnosis.models.summary_numbers`` turns ``headline`` or ``normal`` with their bounds and
spans into ``Measured``, whose ``reading(key)`` is a ``Reading``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy import JSON, TypeDecorator
from sqlalchemy.engine import Dialect

log = logging.getLogger("ruleloop.store")

Numbers = dict[str, float | None]


class CauseEntry(BaseModel):
    """One cause hypothesis as the diagnosis judged it (``CauseVerdict.to_json``)."""

    model_config = ConfigDict(extra="allow")

    cause: str
    title: str = ""
    verdict: str = "cannot_tell"
    evidence: str = ""
    number: str | None = None
    missing: list[str] = Field(default_factory=list)


class ReplicaRule(BaseModel):
    """The rule that named a replica slow: at least ``min_requests``, and ``factor`` x the
    others' p99 below ``share_beyond`` of its requests."""

    min_requests: int = 0
    factor: float = 0.0
    share_beyond: float = 0.0


class StoredReplica(BaseModel):
    """One replica's row of a fleet's diagnosis: its p99s (ms; None: not measured), which of
    them are only bounds, its state and why."""

    model_config = ConfigDict(extra="allow")

    replica: str
    state: str
    node: str | None = None
    requests: int | None = None
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    queue_time_p99_ms: float | None = None
    bounds: dict[str, str] = Field(default_factory=dict)  # key -> "<=" or ">"
    why: str = ""
    note: str | None = None


class StoredFleet(BaseModel):
    """One replica or all of them: the fleet's verdict as a diagnosis keeps it."""

    model_config = ConfigDict(extra="allow")

    kind: str = ""
    line: str = ""
    rule: ReplicaRule = Field(default_factory=ReplicaRule)
    slow: list[str] = Field(default_factory=list)
    by_hand: str | None = None
    rows: list[StoredReplica] = Field(default_factory=list)


class DiagnosisSummary(BaseModel):
    """The headline numbers and what the diagnosis concluded; empty until one finished
    (``failed``: the last one failed)."""

    model_config = ConfigDict(extra="allow")

    target: str | None = None
    runbook: str | None = None
    headline: Numbers = Field(default_factory=dict)  # the four numbers, the engine's
    baseline: dict[str, tuple[float, str]] = Field(default_factory=dict)  # gate, ADR
    worst: str = "ok"  # the worst finding's severity
    matches: list[str] = Field(default_factory=list)  # the ADRs offered
    withheld_matches: list[str] = Field(default_factory=list)  # matched, not offered
    timings_s: dict[str, float] = Field(default_factory=dict)
    readings: Numbers = Field(default_factory=dict)
    normal: Numbers = Field(default_factory=dict)  # the target's normal (snapshots)
    bounds: dict[str, str] = Field(default_factory=dict)
    spans: dict[str, tuple[float, float]] = Field(default_factory=dict)
    reading_bounds: dict[str, str] = Field(default_factory=dict)
    reading_spans: dict[str, tuple[float, float]] = Field(default_factory=dict)
    normal_bounds: dict[str, str] = Field(default_factory=dict)
    normal_spans: dict[str, tuple[float, float]] = Field(default_factory=dict)
    findings: list[tuple[str, str, str]] = Field(default_factory=list)  # severity, text, source
    chart: dict[str, Any] | None = None  # ``ChartData.to_json``
    replicas: StoredFleet | None = None  # one replica or all of them (``summary_json``)
    causes: list[CauseEntry] = Field(default_factory=list)
    failed: bool = False

    @field_validator("causes", mode="before")
    @classmethod
    def _named_causes(cls, value: Any) -> Any:
        """An entry that names no cause is not a verdict: dropped, the others kept."""
        if not isinstance(value, list):
            return value
        return [e for e in value if isinstance(e, Mapping) and isinstance(e.get("cause"), str)]

    @property
    def diagnosed(self) -> bool:
        """A diagnosis finished and measured the headline."""
        return bool(self.headline)

    def json_dict(self) -> dict[str, Any]:
        """The summary as JSON data, for the column and the audit log."""
        data: dict[str, Any] = self.model_dump(mode="json")
        return data

    def supported(self) -> list[str]:
        """The causes the diagnosis supports, in its order."""
        return [c.cause for c in self.causes if c.verdict == "supported"]

    @classmethod
    def of(cls, data: DiagnosisSummary | Mapping[str, Any] | None) -> DiagnosisSummary:
        """A summary from stored JSON (None or empty: not diagnosed). A part of another shape
        is dropped (logged), never the whole summary."""
        if isinstance(data, DiagnosisSummary):
            return data
        raw = dict(data or {})
        for _ in range(len(cls.model_fields) + 1):
            try:
                return cls.model_validate(raw)
            except ValidationError as exc:
                bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
                if not bad & raw.keys():
                    break
                log.warning("a stored diagnosis summary's %s dropped: %s", sorted(bad), exc)
                raw = {k: v for k, v in raw.items() if k not in bad}
        return cls()


class SummaryColumn(TypeDecorator[DiagnosisSummary]):
    """A JSON column that reads back as ``DiagnosisSummary`` (and takes one, or its JSON)."""

    impl = JSON
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> dict[str, Any]:
        return DiagnosisSummary.of(value).json_dict()

    def process_result_value(self, value: Any, dialect: Dialect) -> DiagnosisSummary:
        return DiagnosisSummary.of(value)
