"""The slow replica's own GPUs: when the fleet verdict names slow replicas, the hypotheses that
read the fleet's GPU readings (gpu_fault) are judged again on each slow replica's own:

- the runbook's Prometheus queries over every replica's pods (``$instances``: the DCGM
  runbook's, the worst GPU of the fleet), read again for the slow replica's pod alone;
- else the nvml probe's reading of the agent on the slow replica's node (a target's
  ``gpu_agent_daemonset`` reads each node's agent: ``details["nodes"]``).

A fault on another replica's GPU is then not blamed on the slow one, and the slow one's own
fault is named as its own: "the slow replica 10.0.0.7:8000's own GPUs: ..." (or "...'s node
gpu-7: ..."). At most MAX_READ slow replicas are read, the worst first.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from bot.diagnosis.causes import CauseVerdict, judge_one, ranked
from bot.diagnosis.probes.context import ProbeContext, TargetRef
from bot.diagnosis.probes.prometheus import PrometheusParams, instances_regex, read_queries
from bot.diagnosis.replicas import FleetVerdict
from bot.diagnosis.runbooks.loader import LoadedRunbook
from bot.diagnosis.runbooks.models import Hypothesis
from bot.diagnosis.runbooks.runner import RunbookResult
from bot.kernel import RuleloopError
from bot.kernel.numbers import Measured

log = logging.getLogger("ruleloop.diagnosis")

PROBE, NVML = "prometheus", "nvml"
MAX_READ = 3  # slow replicas whose own GPUs are read again (the worst first)


def fleet_queries(loaded: LoadedRunbook) -> PrometheusParams | None:
    """The runbook's Prometheus queries over every replica (``$instances``), or None."""
    for step, params in zip(loaded.runbook.probes, loaded.params, strict=True):
        if step.probe == PROBE and isinstance(params, PrometheusParams):
            queries = {n: q for n, q in params.queries.items() if "$instances" in q}
            if queries:
                return params.model_copy(update={"queries": queries})
    return None


async def judged_for_slow(
    loaded: LoadedRunbook,
    result: RunbookResult,
    fleet: FleetVerdict | None,
    judged: list[CauseVerdict],
    *,
    target: TargetRef,
    ctx: ProbeContext,
) -> list[CauseVerdict]:
    """``judged`` with each hypothesis that reads the fleet's GPU readings judged again on
    the slow replicas' own (unchanged for one engine, replicas alike, or no such reading)."""
    if fleet is None or not fleet.slow:
        return judged
    own: dict[str, tuple[str, Measured]] = {}  # whose GPUs -> their own readings
    for row in fleet.slow[:MAX_READ]:
        try:
            whose, readings = await _own(loaded, result, fleet, row.address, target, ctx)
        except RuleloopError as exc:  # the fleet's verdicts stand; the log says why
            log.warning("could not read the slow replica %s's own GPUs: %s", row.address, exc)
            return judged
        if readings.readings:
            own[row.address] = (whose, readings)
    names = {n for _, readings in own.values() for n in readings.readings}
    by_cause = {v.cause: v for v in judged}
    for hypothesis in loaded.runbook.hypotheses:
        fleet_wide = by_cause.get(hypothesis.cause)
        if fleet_wide is not None and names & set(hypothesis.readings):
            by_cause[hypothesis.cause] = _for_slow(hypothesis, fleet_wide, result.readings, own)
    return ranked(by_cause.values())


async def _own(
    loaded: LoadedRunbook,
    result: RunbookResult,
    fleet: FleetVerdict,
    address: str,
    target: TargetRef,
    ctx: ProbeContext,
) -> tuple[str, Measured]:
    """One slow replica's own GPU readings, and whose they are: the runbook's ``$instances``
    queries for its pod alone, or the nvml probe's reading of its node's agent (none: empty)."""
    params, url = fleet_queries(loaded), target.target.prometheus_url
    found: list[tuple[str, Measured]] = []
    if params is not None and url is not None:
        instance = address.split("/", 1)[0]
        readings, _ = await read_queries(
            ctx, url, params, instances=instances_regex([instance]), instance=instance
        )
        found.append((f"{address}'s own GPUs", Measured.of(readings).under(PROBE)))
    node = fleet.nodes.get(address)
    nodes = result.details.get(NVML, {}).get("nodes") or {}
    if node is not None and node in nodes:
        found.append((f"{address}'s node {node}", Measured.of(nodes[node]).under(NVML)))
    own = Measured()
    for _, part in found:
        own |= part
    return (found[0][0] if found else ""), own


def _for_slow(
    hypothesis: Hypothesis,
    fleet_wide: CauseVerdict,
    fleet: Measured,
    own: dict[str, tuple[str, Measured]],
) -> CauseVerdict:
    """The hypothesis on the slow replicas' own readings: supported by the first whose own
    GPUs support it; ruled out when every one read rules it out (another replica's fault
    named beside, not blamed); else cannot tell, saying why."""
    title = fleet_wide.title
    verdicts = {whose: judge_one(hypothesis, title, fleet | r) for whose, r in own.values()}
    for whose, v in verdicts.items():
        if v.verdict == "supported":
            evidence = f"the slow replica {whose}: {v.evidence}"
            return replace(v, evidence=evidence, number=f"{whose}: {v.number}")
    if all(v.verdict == "ruled_out" for v in verdicts.values()):
        number = "; ".join(f"{whose}: {v.number}" for whose, v in verdicts.items())
        if fleet_wide.verdict == "supported":
            number += f" (the fleet's worst GPU, not the slow replica's: {fleet_wide.number})"
        return CauseVerdict(hypothesis.cause, title, "ruled_out", number, number)
    whose, first = next((w, v) for w, v in verdicts.items() if v.verdict == "cannot_tell")
    return replace(first, evidence=f"the slow replica {whose}: {first.evidence}")
