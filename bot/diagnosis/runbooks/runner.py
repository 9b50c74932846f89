"""Runs a runbook: its probes concurrently, then its finding rules over the readings.

A probe that fails does not stop the others: a known error becomes a warning finding that
reads as advice; an unknown one becomes a finding with a correlation id that is also logged.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from bot.adr.workload import WorkloadShape
from bot.diagnosis.probes.context import ProbeContext, TargetRef
from bot.diagnosis.probes.sampling import SampledWindow
from bot.diagnosis.probes.types import Finding, ProbeResult, Severity
from bot.diagnosis.runbooks.loader import LoadedRunbook
from bot.diagnosis.runbooks.registry import ProbeRegistry
from bot.kernel import RuleloopError
from bot.kernel.numbers import Measured, Reading, compare
from bot.kernel.runtime import new_error_id, span
from bot.kernel.runtime.redact import redact

log = logging.getLogger("ruleloop.runbooks")


@dataclass
class RunbookResult:
    """Every reading as `probe.reading`, every finding (worst first), and probe details."""

    runbook: str
    readings: Measured = field(default_factory=Measured)  # by `probe.reading`
    findings: list[Finding] = field(default_factory=list)
    details: dict[str, dict[str, Any]] = field(default_factory=dict)
    windows: dict[str, SampledWindow] = field(default_factory=dict)  # by probe, those read
    workload: WorkloadShape | None = None  # production's, from the first probe that read it
    workload_unknown: str = ""  # why none was, where one was looked for

    def reading(self, name: str) -> float | None:
        """One reading's value by its dotted name, None when absent or unmeasured."""
        return self.readings.value(name)


class RunbookRunner:
    """Runs loaded runbooks with the probes of one registry."""

    def __init__(self, *, registry: ProbeRegistry) -> None:
        self._registry = registry

    async def run(
        self, loaded: LoadedRunbook, *, target: TargetRef, ctx: ProbeContext
    ) -> RunbookResult:
        """Run every probe, then apply the finding rules."""
        steps = list(zip(loaded.runbook.probes, loaded.params, strict=True))
        outcomes = await asyncio.gather(
            *(self._probe(step.probe, target, params, ctx) for step, params in steps),
            return_exceptions=True,
        )
        result = RunbookResult(runbook=loaded.name)
        for (step, _), outcome in zip(steps, outcomes, strict=True):
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # cancellation and the like are not probe failures
            probe_result = (
                outcome if isinstance(outcome, ProbeResult) else _failed(step.probe, outcome)
            )
            result.readings |= probe_result.readings.under(step.probe)
            if probe_result.window is not None:
                result.windows[step.probe] = probe_result.window
            if result.workload is None:
                result.workload = probe_result.workload
                result.workload_unknown = result.workload_unknown or probe_result.workload_unknown
            result.findings.extend(probe_result.findings)
            if probe_result.details:
                result.details[step.probe] = probe_result.details
        result.findings.extend(evaluate(loaded, result.readings))
        result.findings.sort(key=lambda f: -f.severity)
        return result

    async def _probe(
        self, name: str, target: TargetRef, params: Any, ctx: ProbeContext
    ) -> ProbeResult:
        """One probe's run, in a span of its own (a child of the diagnosis's)."""
        with span(f"probe.{name}", probe=name):
            return await self._registry.get(name).run(target=target, params=params, ctx=ctx)


def evaluate(loaded: LoadedRunbook, readings: Measured) -> list[Finding]:
    """The findings whose rule holds for the readings (an unmeasured reading never holds, nor
    does a bound or an estimate's span that does not decide the rule: '≤ 10 ms' is not over
    5 ms, nor under it)."""
    found = []
    for rule in loaded.runbook.findings:
        probe, reading, op, limit = rule.parts
        value = readings.reading(f"{probe}.{reading}")
        if value is not None and compare(value, op, Reading(limit)):
            found.append(
                Finding(
                    severity=Severity.parse(rule.severity),
                    message=rule.message.format(value=value.value, limit=limit),
                    source=f"{loaded.name}: {rule.when.strip()}",
                    value=value.value,
                )
            )
    return found


def _failed(probe: str, exc: BaseException) -> ProbeResult:
    if isinstance(exc, RuleloopError):
        return ProbeResult(
            findings=[Finding(Severity.WARNING, redact(f"{probe} could not run: {exc}"), probe)]
        )
    error_id = new_error_id()
    log.error("probe %s failed unexpectedly (id %s)", probe, error_id, exc_info=exc)
    message = f"{probe} failed unexpectedly (id {error_id}; details in the bot's log)"
    return ProbeResult(findings=[Finding(Severity.WARNING, message, probe)])
