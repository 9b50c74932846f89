"""Causes, not symptoms: the runbook's hypotheses judged on the run's readings.

Each hypothesis ends supported, ruled out, or cannot tell (naming the readings that were not
measured). A reading that is only a bound or an estimate's span decides a condition only where
the whole bound does (``bot.kernel.numbers.reading.compare``). One cause is judged in code, not
YAML: ``one_replica`` comes from the fleet verdict (bot/diagnosis/replicas.py), and only for a
fleet; ``prefix_cache_lost`` compares the live prefix-cache share with the one the rules in force
were proven at (their ADRs' workload shapes), which a YAML condition cannot read.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bot.adr import Adr, Verdict
from bot.adr import causes as vocabulary
from bot.diagnosis.replicas import FleetVerdict, ratio
from bot.diagnosis.runbooks.models import PLACEHOLDER, Hypothesis, Runbook
from bot.kernel.numbers import Measured, in_unit, show, show_reading, unit_of
from bot.kernel.store import DiagnosisSummary

# What to do when a probe's readings are missing altogether (the data gaps' advice).
GAP_ADVICE = {
    "nvml": "no GPU snapshot: configure `ruleloop agent` on the GPU nodes",
    "queue_cancel": "no queue or cancellation readings: the engine's /metrics gave none",
    "vllm_metrics": "no engine window: the engine's /metrics could not be read",
}
# Built-in causes no shipped hypothesis judges yet, and why (a runbook may add one for them).
NOT_JUDGED = {
    "prefix_cache_lost": "the rules in force here were not read (no store)",
    "gateway_latency": "the runbook has no queue_cancel probe (it reads the gateway)",
    "workload_drift": "the rules in force here were not read (no store)",
}
# Readings of engine features vLLM exposes only when they are on (engine_signals.py): missing,
# they say the engine does not run the feature, not that the window was lost, so they name why
# and are no data gap.
FEATURE_READINGS = {
    "vllm_metrics.spec_acceptance_rate": "no tokens drafted: speculative decoding is off "
    "(--speculative-config) or drafted nothing in the window",
    "vllm_metrics.kv_fetch_share": "no KV-load stages: the engine has no KV connector that "
    "loads KV (--kv-transfer-config)",
    "vllm_metrics.lora_waiting_adapters": "no LoRA states: LoRA is off (--enable-lora)",
    "vllm_metrics.lora_adapter_swaps": "no LoRA states: LoRA is off (--enable-lora)",
    "vllm_metrics.deferred_share": "no deferred-request gauge: an engine older than vLLM's "
    "waiting-by-reason split",
}
_ORDER: dict[Verdict, int] = {"supported": 0, "ruled_out": 1, "cannot_tell": 2}
CACHED_SHARE = "vllm_metrics.cached_prompt_share"
GATEWAY_TTFT = "queue_cancel.gateway_ttft_p99_ms"
ENGINE_TTFT = "queue_cancel.engine_ttft_p99_ms"
# gateway_latency: the gateway adds more than ADDED_SHARE of its TTFT p99 and ADDED_MS at least;
# under CLOSE_SHARE of it, or under ADDED_MS, it does not.
ADDED_SHARE = 0.5
CLOSE_SHARE = 0.2
ADDED_MS = 100.0
# prefix_cache_lost: a rule proven with at least this hit rate leaned on the cache; the live
# share under LOST_BELOW of it is lost, at CLOSE_TO of it or more it is not.
LEANED_ON = 0.2
LOST_BELOW = 0.5
CLOSE_TO = 0.8


@dataclass(frozen=True)
class DriftCheck:
    """The drift job's latest comparison of the target's live workload with its rules' shapes:
    when, the ADRs it compared, and the drifted dimensions' lines of those that drifted."""

    at: dt.datetime
    checked: tuple[str, ...]
    drifted: Mapping[str, list[str]]


@dataclass(frozen=True)
class RulesInForce:
    """What the diagnosis knows of the rules in force on its target: their accepted ADRs
    (bot/change/in_force.py decides which) and the drift job's latest check, if any."""

    adrs: tuple[Adr, ...] = ()
    drift: DriftCheck | None = None


@dataclass(frozen=True)
class CauseVerdict:
    """One cause judged: its verdict, what shows it, its one number, and what was missing."""

    cause: str
    title: str
    verdict: Verdict
    evidence: str
    number: str | None = None
    missing: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        """The summary's ``causes`` entry (the ADR matching, memory and stats key on it)."""
        return {
            "cause": self.cause,
            "title": self.title,
            "verdict": self.verdict,
            "evidence": self.evidence,
            "number": self.number,
            "missing": list(self.missing),
        }


def filled(readings: Measured, template: str) -> str:
    """``{probe.reading}`` placeholders written as every surface writes numbers."""

    def one(m: Any) -> str:
        name = m[1]
        key = name.rsplit(".", 1)[-1]
        found = readings.reading(name)
        if found is not None and found.span is not None and not unit_of(key):
            low, high = found.span
            return f"{in_unit(low, '')}–{in_unit(high, '')}"  # a bucket of a count
        return show_reading(key, found)

    return PLACEHOLDER.sub(one, template)


def judge(
    runbook: Runbook,
    readings: Measured,
    fleet: FleetVerdict | None = None,
    rules: RulesInForce | None = None,
) -> list[CauseVerdict]:
    """Every hypothesis of the runbook (and one_replica for a fleet, before them), supported
    first, then ruled out, then cannot tell; each group in the runbook's order. A runbook without
    hypotheses names no cause (its thread reads as before). With ``rules`` (the rules in force on
    the target), the causes judged against them too."""
    if not runbook.hypotheses:
        return []
    titles = vocabulary.known({c.name: vocabulary.Cause(c.name, c.title) for c in runbook.causes})
    verdicts = [
        judge_one(h, titles[h.cause].title if h.cause in titles else h.cause, readings)
        for h in runbook.hypotheses
    ]
    if fleet is not None:  # first: one slow replica is not a fleet-wide cause
        verdicts.insert(0, one_replica(fleet))
    judged = {h.cause for h in runbook.hypotheses}
    if GATEWAY_TTFT in readings.readings and "gateway_latency" not in judged:
        verdicts.append(gateway_latency(readings))
        judged.add("gateway_latency")
    if rules is not None and "prefix_cache_lost" not in judged:
        verdicts.append(prefix_cache_lost(rules, readings))
        judged.add("prefix_cache_lost")
    if rules is not None and "workload_drift" not in judged:
        verdicts.append(workload_drift(rules))
        judged.add("workload_drift")
    verdicts += [
        CauseVerdict(name, titles[name].title, "cannot_tell", f"not judged: {why}")
        for name, why in NOT_JUDGED.items()
        if name not in judged
    ]
    return ranked(verdicts)


def ranked(verdicts: Iterable[CauseVerdict]) -> list[CauseVerdict]:
    """Supported first, then ruled out, then cannot tell; each group in the given order."""
    return sorted(verdicts, key=lambda v: _ORDER[v.verdict])


def judge_one(hypothesis: Hypothesis, title: str, readings: Measured) -> CauseVerdict:
    """One hypothesis: supported, ruled out, or cannot tell with what was missing."""
    read = readings.reading
    supported = hypothesis.supported.holds(read)
    ruling = hypothesis.ruled_out
    ruled_out = (supported is False) if ruling is None else ruling.holds(read)
    number = filled(readings, hypothesis.number)
    if supported is True and ruled_out is not True:
        return CauseVerdict(
            hypothesis.cause, title, "supported", filled(readings, hypothesis.evidence), number
        )
    if ruled_out is True and supported is not True:
        return CauseVerdict(hypothesis.cause, title, "ruled_out", number, number)
    return _cannot_tell(hypothesis, title, readings, both=supported is True)


def _cannot_tell(
    hypothesis: Hypothesis, title: str, readings: Measured, *, both: bool
) -> CauseVerdict:
    """Why neither condition decided: readings not measured, or numbers in between."""
    names = [*hypothesis.supported.readings]
    if hypothesis.ruled_out is not None:
        names += hypothesis.ruled_out.readings
    missing = tuple(n for n in dict.fromkeys(names) if readings.reading(n) is None)
    if both:
        why = "both its conditions hold: the runbook's supported_when and ruled_out_when overlap"
    elif missing:
        why = f"not measured: {', '.join(missing)}"
        features = dict.fromkeys(FEATURE_READINGS[n] for n in missing if n in FEATURE_READINGS)
        why += "".join(f" ({f})" for f in features)
    else:
        why = f"in between: {filled(readings, hypothesis.number)}"
    number = None if missing else filled(readings, hypothesis.number)
    return CauseVerdict(hypothesis.cause, title, "cannot_tell", why, number, missing)


def one_replica(fleet: FleetVerdict) -> CauseVerdict:
    """The fleet verdict as a cause: an outlier supports it, replicas alike rule it out."""
    title = vocabulary.BUILTIN["one_replica"].title
    kind = fleet.kind
    if kind == "outlier":
        slow = fleet.slow[0]
        times = ratio(slow.slow[0]) if slow.slow else None
        number = slow.address if times is None else f"{slow.address}: {times:.1f}x the others"
        text = f"replica {slow.address} is slower than the others ({number})"
        return CauseVerdict("one_replica", title, "supported", text, number)
    if kind == "alike":
        text = f"{len(fleet.rows)} replicas alike"
        return CauseVerdict("one_replica", title, "ruled_out", text, text)
    why = "the replicas' numbers could not be compared"
    return CauseVerdict("one_replica", title, "cannot_tell", why)


def prefix_cache_lost(rules: RulesInForce, readings: Measured) -> CauseVerdict:
    """The live share of prompt tokens the prefix cache served against the hit rate the rule in
    force was proven at (its ADR's workload shape): far below it supports the cause."""
    title = vocabulary.BUILTIN["prefix_cache_lost"].title
    proven = [(a.id, a.workload.prefix.hit_rate) for a in rules.adrs
              if a.workload is not None and a.workload.prefix.hit_rate is not None]  # fmt: skip
    if not proven:
        why = "no rule in force here records the prefix-cache hit rate it was proven at"
        return CauseVerdict("prefix_cache_lost", title, "cannot_tell", why)
    adr_id, then = max(proven, key=lambda p: p[1])  # the rule that leaned on the cache most
    reading = readings.reading(CACHED_SHARE)
    if reading is None or reading.bound is not None:
        why = f"not measured: {CACHED_SHARE}"
        return CauseVerdict("prefix_cache_lost", title, "cannot_tell", why, None, (CACHED_SHARE,))
    now, pct = reading.value, _share
    number = f"{pct(now)} of prompt tokens cached, {pct(then)} when {adr_id} was proven"
    if then >= LEANED_ON and now < then * LOST_BELOW:
        text = f"the prefix cache served {pct(now)} of prompt tokens, {pct(then)} under {adr_id}"
        return CauseVerdict("prefix_cache_lost", title, "supported", text, number)
    if then < LEANED_ON or now >= then * CLOSE_TO:
        return CauseVerdict("prefix_cache_lost", title, "ruled_out", number, number)
    return CauseVerdict("prefix_cache_lost", title, "cannot_tell", f"in between: {number}", number)


def gateway_latency(readings: Measured) -> CauseVerdict:
    """The gateway's TTFT p99 against the engine's over the same window (the queue_cancel
    probe brackets the engine's window with two gateway scrapes): what the gateway adds."""
    title = vocabulary.BUILTIN["gateway_latency"].title
    gateway, engine = readings.reading(GATEWAY_TTFT), readings.reading(ENGINE_TTFT)
    if gateway is None or engine is None:
        if gateway is None:  # no gateway is no data gap: many targets have none
            why = "no gateway TTFT: no gateway_url, or no streamed answer began in the window"
            return CauseVerdict("gateway_latency", title, "cannot_tell", why)
        why = f"not measured: {ENGINE_TTFT}"
        return CauseVerdict("gateway_latency", title, "cannot_tell", why, None, (ENGINE_TTFT,))
    if gateway.bound is not None or engine.bound is not None:
        why = "a TTFT p99 fell in its histogram's first or last bucket: only a bound"
        return CauseVerdict("gateway_latency", title, "cannot_tell", why)
    added = gateway.value - engine.value
    number = (f"TTFT p99 {show('ttft_p99_ms', gateway.value)} at the gateway, "
              f"{show('ttft_p99_ms', engine.value)} at the engine")  # fmt: skip
    if added > ADDED_MS and added > ADDED_SHARE * gateway.value:
        text = f"the gateway adds {show('ttft_p99_ms', added)} to the engine's TTFT p99 ({number})"
        return CauseVerdict("gateway_latency", title, "supported", text, number)
    if added < ADDED_MS or added < CLOSE_SHARE * gateway.value:
        return CauseVerdict("gateway_latency", title, "ruled_out", number, number)
    return CauseVerdict("gateway_latency", title, "cannot_tell", f"in between: {number}", number)


def workload_drift(rules: RulesInForce) -> CauseVerdict:
    """The drift job's latest check: did the live workload move away from the shape a rule in
    force was proven under (bot/app/scheduler/workload_drift.py compares them)?"""
    title = vocabulary.BUILTIN["workload_drift"].title
    check, ids = rules.drift, [adr.id for adr in rules.adrs]
    if not ids:
        why = "no rule in force here to compare the workload with"
        return CauseVerdict("workload_drift", title, "cannot_tell", why)
    if check is None:
        why = "the drift job has not compared this workload yet ([scheduler] workload_every_s)"
        return CauseVerdict("workload_drift", title, "cannot_tell", why)
    when = f"{check.at.day} {check.at:%b %H:%M} UTC"
    moved = [(i, check.drifted[i]) for i in ids if check.drifted.get(i)]
    if moved:
        adr_id, lines = moved[0]
        text = f"the drift job found the workload moved from {adr_id}'s on {when}: " + "; ".join(
            lines
        )
        return CauseVerdict("workload_drift", title, "supported", text, lines[0])
    if any(i in check.checked for i in ids):
        text = f"the workload matched the rules' shapes at the drift job's check on {when}"
        return CauseVerdict("workload_drift", title, "ruled_out", text, f"alike on {when}")
    why = f"the drift job's last check ({when}) did not compare the rules in force now"
    return CauseVerdict("workload_drift", title, "cannot_tell", why)


def _share(value: float) -> str:
    return show("cached_prompt_share", value)


def data_gaps(verdicts: Iterable[CauseVerdict]) -> list[str]:
    """One line per probe whose missing readings left a cause undecided, with what to do (a
    feature the engine does not run, ``FEATURE_READINGS``, is no gap)."""
    probes = dict.fromkeys(
        name.split(".", 1)[0]
        for v in verdicts
        if v.verdict == "cannot_tell"
        for name in v.missing
        if name not in FEATURE_READINGS
    )
    return [GAP_ADVICE.get(p, f"no {p} readings") for p in probes]


def likely(verdicts: Iterable[CauseVerdict]) -> CauseVerdict | None:
    """The most likely cause: the first supported one (the runbook's order ranks them)."""
    return next((v for v in verdicts if v.verdict == "supported"), None)


def from_summary(summary: DiagnosisSummary) -> list[CauseVerdict]:
    """A stored summary's ``causes`` read back (an entry of an unknown verdict is dropped)."""
    return [
        CauseVerdict(
            cause=e.cause,
            title=e.title,
            verdict=e.verdict,
            evidence=e.evidence,
            number=e.number,
            missing=tuple(e.missing),
        )
        for e in summary.causes
        if e.verdict in _ORDER
    ]
