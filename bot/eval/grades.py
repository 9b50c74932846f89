"""How one diagnosis is graded against its scenario's truth.

- **Cause grade** of the top cause (the first supported, the runbook's order ranks them):
  100 the right cause; 65 the right family (``FAMILIES``: the same part of the system, and the
  same fix lever); 35 a cause the scenario calls related (``truth.related``: a cause the real one
  brings with it, as KV pressure brings a queue); 0 a wrong one. Abstaining (no cause supported)
  is 100 where the truth has no engine cause, and 20 where it has one: rewarded over a wrong
  guess, never equal to being right.
- **Ruled out**: precision (of the causes it ruled out, the share that were not the cause) and
  recall (of the causes the truth says must be ruled out, the share it ruled out).
- **Cannot tell**: of the causes the data cannot decide, the share it said "cannot tell" about.
- **Extra time**: seconds from the alert to the findings beyond the sampling window.
- **ADR**: the ADR offered against the one the truth names (``none``: none should be); not
  graded where the truth names none.
- **Fix**: where the scenario tries a fix (bot/eval/fix.py), whether its gate kept it or rolled
  it back, and whether that was right.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from bot.eval.fix import FixOutcome
from bot.eval.scenario import Scenario

RIGHT, FAMILY, RELATED, ABSTAINED, WRONG = 100, 65, 35, 20, 0
# The part of the serving system a cause lives in: naming a cause of the right family sends the
# responder to the right dashboard and the right lever.
FAMILIES: Mapping[str, str] = {
    "prefill_decode_mixing": "scheduler",
    "queueing": "scheduler",
    "kv_cache_pressure": "memory",
    "prefix_cache_lost": "memory",
    "abandoned_work": "clients",
    "gateway_latency": "clients",
    "one_replica": "fleet",
    "gpu_fault": "hardware",
    "workload_drift": "workload",
    "spec_decode_collapse": "scheduler",
    "deferred_waiting": "scheduler",
    "lora_adapter_churn": "memory",
    "kv_transfer_stall": "memory",
}


class Graded(BaseModel):
    """One scenario's grades (what the table prints, and what the JSON keeps)."""

    model_config = ConfigDict(frozen=True)

    scenario: str
    truth: list[str]  # the causes (empty: none in the engine)
    top: str | None  # the top supported cause, None when it abstained
    supported: list[str]
    ruled_out: list[str]
    cannot_tell: list[str]
    must_rule_out: list[str]  # the truth's
    grade: int
    why: str  # the grade in words: what it named, against what
    misses: list[str]  # beyond the grade: what it ruled out wrongly, left undecided, or skipped
    ruled_out_precision: float | None  # None: it ruled nothing out
    ruled_out_recall: float | None  # None: the truth asks nothing to be ruled out
    cannot_tell_right: float | None  # None: the truth names nothing undecidable
    abstained: bool
    extra_s: float  # seconds from the alert to the findings beyond the sampling window
    window_s: float
    adr_offered: list[str]
    adr_right: bool | None  # None: not graded
    sent: int  # requests the load sent during the diagnosis
    fix: FixOutcome | None = None  # the fix tried behind its gates, where the scenario has one


def cause_grade(truth: Sequence[str], related: Sequence[str], top: str | None) -> tuple[int, str]:
    """The grade of the top cause and why."""
    if top is None:
        if not truth:
            return RIGHT, "abstained: no cause in the engine, none named"
        return ABSTAINED, f"abstained: named no cause, the cause was {', '.join(truth)}"
    if top in truth:
        return RIGHT, f"named {top}, the cause"
    if not truth:
        return WRONG, f"named {top}, but the engine had no cause"
    families = {FAMILIES.get(c) for c in truth} - {None}
    if FAMILIES.get(top) in families:
        return (
            FAMILY,
            f"named {top}, of the cause's family ({FAMILIES[top]}); the cause was "
            f"{', '.join(truth)}",
        )
    if top in related:
        return RELATED, f"named {top}, related to the cause {', '.join(truth)}"
    return WRONG, f"named {top}; the cause was {', '.join(truth)}"


def grade(
    scenario: Scenario,
    verdicts: Mapping[str, str],
    *,
    offered: Sequence[str],
    extra_s: float,
    window_s: float,
    sent: int,
    fix: FixOutcome | None = None,
) -> Graded:
    """Grade a diagnosis's cause verdicts (cause -> supported, ruled_out or cannot_tell, in the
    diagnosis's order: supported first, the runbook's rank within)."""
    truth = scenario.truth
    supported = [c for c, v in verdicts.items() if v == "supported"]
    ruled = [c for c, v in verdicts.items() if v == "ruled_out"]
    undecided = [c for c, v in verdicts.items() if v == "cannot_tell"]
    top = supported[0] if supported else None
    points, why = cause_grade(truth.causes, truth.related, top)
    precision = sum(c not in truth.causes for c in ruled) / len(ruled) if ruled else None
    recall = (
        sum(c in ruled for c in truth.ruled_out) / len(truth.ruled_out) if truth.ruled_out else None
    )
    told = (
        sum(c in undecided for c in truth.cannot_tell) / len(truth.cannot_tell)
        if truth.cannot_tell else None
    )  # fmt: skip
    misses = [f"ruled out {c}, a cause" for c in ruled if c in truth.causes]
    misses += [f"{c} not ruled out ({verdicts.get(c, 'not judged')})"
               for c in truth.ruled_out if c not in ruled]  # fmt: skip
    misses += [f"{c}: {verdicts.get(c, 'not judged at all')}, where the data cannot tell"
               for c in truth.cannot_tell if c not in undecided]  # fmt: skip
    if fix is not None and not fix.right:
        misses.append(f"the gate {'kept' if fix.kept else 'rolled back'} {fix.adr} ({fix.said})")
    adr_right = None
    if truth.adr is not None:
        adr_right = (list(offered) == []) if truth.adr == "none" else truth.adr in offered[:1]
    return Graded(
        scenario=scenario.name, truth=list(truth.causes), top=top, supported=supported,
        ruled_out=ruled, cannot_tell=undecided, must_rule_out=list(truth.ruled_out),
        grade=points, why=why, misses=misses,
        ruled_out_precision=precision, ruled_out_recall=recall, cannot_tell_right=told,
        abstained=top is None, extra_s=extra_s, window_s=window_s, adr_offered=list(offered),
        adr_right=adr_right, sent=sent, fix=fix,
    )  # fmt: skip
