"""The runbook engine's vocabulary: the Probe role, what a probe returns, findings, severity."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from bot.kernel.numbers import Measured

if TYPE_CHECKING:
    from bot.adr.workload import WorkloadShape
    from bot.diagnosis.probes.context import ProbeContext, TargetRef
    from bot.diagnosis.probes.sampling import SampledWindow


class Severity(IntEnum):
    """How much a finding matters; ordered so that max() picks the worst."""

    INFO = 1
    WARNING = 2
    CRITICAL = 3

    @classmethod
    def parse(cls, name: str) -> Severity:
        """'warning' -> Severity.WARNING."""
        return cls[name.upper()]

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Finding:
    """A reading that means something: what was seen, how bad, and which probe or rule saw it."""

    severity: Severity
    message: str
    source: str
    value: float | None = None


@dataclass
class ProbeResult:
    """What one probe read: named numbers, its own findings, and details for people."""

    readings: Measured = field(default_factory=Measured)  # None: looked for, not measured
    findings: list[Finding] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    window: SampledWindow | None = None  # the engine window it read (the chart draws it)
    # production's workload in that window (what ADRs proven on a workload are matched by);
    # None, with why in ``workload_unknown``, where it could not be read
    workload: WorkloadShape | None = None
    workload_unknown: str = ""


class Params(BaseModel):
    """Base for a probe's parameter model: strict, so a typo in a runbook fails at startup."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Probe(Protocol):
    """A probe: a name, a parameter model, the readings it yields, and one verb."""

    name: ClassVar[str]
    params_model: ClassVar[type[Params]]

    def readings(self, params: Params) -> Mapping[str, str]:
        """Reading name -> what it means, for these parameters (checked at startup)."""
        ...

    async def run(self, *, target: TargetRef, params: Params, ctx: ProbeContext) -> ProbeResult:
        """Read the target and return readings and findings; raise RuleloopError if unusable."""
        ...
