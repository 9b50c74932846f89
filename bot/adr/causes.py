"""The causes a diagnosis can name and an ADR can answer: one vocabulary for both.

A runbook's hypotheses each name one of these causes (or one the runbook file declares itself);
an ADR's ``cause:`` names the cause it fixes. Matching, memory and stats all key on the name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["supported", "ruled_out", "cannot_tell"]


@dataclass(frozen=True)
class Cause:
    """One cause: its name (the key everywhere) and how it reads on a phone at 2 a.m."""

    name: str
    title: str


# The shipped vocabulary, in the order the article's incidents taught them.
BUILTIN: Mapping[str, Cause] = {
    c.name: c
    for c in (
        Cause("prefill_decode_mixing", "long prefills share scheduler steps with decode"),
        Cause(
            "kv_cache_pressure", "KV-cache pressure: the cache is full, requests wait or preempt"
        ),
        Cause("queueing", "queueing or admission: requests wait for a slot"),
        Cause("abandoned_work", "work for clients that left: aborted requests still prefill"),
        Cause("one_replica", "one replica is slow, the others are not"),
        Cause("gpu_fault", "the GPU itself: throttling, XID errors, ECC, clocks"),
        Cause("prefix_cache_lost", "the prefix cache stopped hitting"),
        Cause("gateway_latency", "the gateway or router adds the latency, not the engine"),
        Cause("workload_drift", "the workload moved away from the one the rules were proven on"),
        Cause(
            "spec_decode_collapse",
            "speculative decoding stopped paying: most drafted tokens are rejected",
        ),
        Cause("kv_transfer_stall", "requests wait for their KV cache to load (connector, offload)"),
        Cause("lora_adapter_churn", "LoRA adapters swap: requests wait for an adapter slot"),
        Cause("deferred_waiting", "requests deferred by a transient constraint, not capacity"),
    )
}


def known(extra: Mapping[str, Cause] | None = None) -> Mapping[str, Cause]:
    """The built-in causes plus those a runbook file declares (a declared name may not
    shadow a built-in one: the loader refuses that)."""
    return {**BUILTIN, **(extra or {})}
