"""Engine features that can hold requests up: speculative decoding, deferred requests, LoRA
adapter slots, KV loads from a connector or an offload tier (issue 44 item 5).

Each reading comes from metrics vLLM 0.32 defines, read from the window's scrapes like the
scheduler's readings (``engine_steps``). A metric the engine lacks (the feature is off, or the
engine is older) reads as None, never 0: its hypothesis then says "cannot tell".

- Speculative decoding (``vllm/v1/spec_decode/metrics.py``, ``SpecDecodingProm``): the counters
  ``vllm:spec_decode_num_drafts_total``, ``_num_draft_tokens_total`` and
  ``_num_accepted_tokens_total``, only on an engine started with ``--speculative-config``. The
  acceptance rate is accepted / drafted tokens over the window (vLLM's own PromQL, in that
  module's docstring); unknown when nothing was drafted in it.
- Deferred requests (``vllm/v1/metrics/loggers.py``): ``vllm:num_requests_waiting_by_reason``
  splits the queue into ``capacity`` and ``deferred`` (held back by a transient constraint: a
  LoRA slot, a KV transfer, a blocked status such as a grammar or a streamed input). The
  deferred share is, over the scrapes, the deferred requests over every request in the engine
  (running plus waiting): the share of the requests' time in the engine they spent deferred, as
  sampled.
- KV loads (``vllm/v1/metrics/loggers.py``): ``vllm:num_requests_kv_fetch_by_stage``, only on an
  engine whose KV connector consumes KV (disaggregated prefill, CPU offload, LMCache): requests
  whose async KV load has not started (``waiting_to_start``) or not finished (``in_progress``).
  ``completed_waiting`` (loaded, not yet scheduled) is a wait for the scheduler, not the load.
  The share is taken as the deferred one is.
- LoRA (``vllm/v1/metrics/loggers.py``): ``vllm:lora_requests_info``, only with ``--enable-lora``:
  a gauge per state, labelled ``max_lora``, ``running_lora_adapters`` and
  ``waiting_lora_adapters`` (adapter names, comma-separated), whose value is the time vLLM last
  saw that state (``set_to_current_time``). The states whose time moved between the window's
  first and last scrapes are those the engine was in during the window. An adapter waits for a
  slot when requests for it wait while the running adapters fill ``max_lora``; and the adapters
  that ran in the window (with those running at its start), beyond ``max_lora``, each had to
  take a slot another adapter held: at least that many swaps.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bot.diagnosis.probes.exposition import Exposition, Labels
from bot.diagnosis.probes.vllm_metrics import counter_delta
from bot.kernel.numbers import Measured

SPEC_DRAFTS = ("vllm:spec_decode_num_drafts_total",)
SPEC_DRAFT_TOKENS = ("vllm:spec_decode_num_draft_tokens_total",)
SPEC_ACCEPTED = ("vllm:spec_decode_num_accepted_tokens_total",)
WAITING_BY_REASON = ("vllm:num_requests_waiting_by_reason",)
KV_FETCH = ("vllm:num_requests_kv_fetch_by_stage",)
LORA_INFO = ("vllm:lora_requests_info",)
RUNNING, WAITING = ("vllm:num_requests_running",), ("vllm:num_requests_waiting",)
SIGNAL_METRICS = frozenset(
    (*SPEC_DRAFTS, *SPEC_DRAFT_TOKENS, *SPEC_ACCEPTED, *WAITING_BY_REASON, *KV_FETCH,
     *LORA_INFO, *RUNNING, *WAITING)
)  # fmt: skip
# The label names and values read (vLLM's, checked against its source by the tests).
DEFERRED = "deferred"
KV_LOADING = ("waiting_to_start", "in_progress")
LORA_LABELS = ("max_lora", "running_lora_adapters", "waiting_lora_adapters")

SIGNAL_READINGS = {
    "spec_acceptance_rate": "speculative decoding: share of the window's drafted tokens the "
    "target model accepted (unknown without --speculative-config or with nothing drafted)",
    "spec_accepted_per_draft": "speculative decoding: accepted tokens per draft in the window",
    "deferred_share": "of the requests' time in the engine (running or waiting, sampled at "
    "each scrape), the share deferred by a transient constraint (LoRA slot, KV transfer, a "
    "blocked status)",
    "waiting_deferred": "peak requests deferred by a transient constraint",
    "kv_fetch_share": "of the requests' time in the engine (sampled at each scrape), the share "
    "spent waiting for an async KV load (a KV connector or offload tier) to start or finish",
    "kv_fetch_waiting": "peak requests whose async KV load had not finished",
    "lora_waiting_adapters": "peak LoRA adapters whose requests waited for an adapter slot "
    "while the running adapters filled --max-loras",
    "lora_adapter_swaps": "LoRA adapters that ran in the window beyond --max-loras slots: at "
    "least this many took a slot another adapter held",
}


def read_signals(pages: Sequence[Exposition]) -> Measured:
    """Every engine-feature reading of the window whose first and last scrapes are
    ``pages[0]`` and ``pages[-1]`` (the scrapes between give the shares and peaks)."""
    before, after = pages[0], pages[-1]
    inside = pages[1:] or pages
    drafts = counter_delta(before, after, SPEC_DRAFTS)
    draft_tokens = counter_delta(before, after, SPEC_DRAFT_TOKENS)
    accepted = counter_delta(before, after, SPEC_ACCEPTED)
    lora = _Lora.read(before, after)
    return Measured.of(
        {
            "spec_acceptance_rate": _ratio(accepted, draft_tokens),
            "spec_accepted_per_draft": _ratio(accepted, drafts),
            "deferred_share": _time_share(inside, WAITING_BY_REASON[0], "reason", (DEFERRED,)),
            "waiting_deferred": _peak(inside, WAITING_BY_REASON[0], "reason", (DEFERRED,)),
            "kv_fetch_share": _time_share(inside, KV_FETCH[0], "stage", KV_LOADING),
            "kv_fetch_waiting": _peak(inside, KV_FETCH[0], "stage", KV_LOADING),
            "lora_waiting_adapters": None if lora is None else lora.waiting,
            "lora_adapter_swaps": None if lora is None else lora.swaps,
        }
    )


def _held(page: Exposition, name: str, label: str, values: Sequence[str]) -> float | None:
    """Requests of ``name`` whose ``label`` is one of ``values`` on one page; None without it."""
    parts = [page.total(name, where={label: v}) for v in values]
    known = [p for p in parts if p is not None]
    return sum(known) if known else None


def _peak(
    pages: Sequence[Exposition], name: str, label: str, values: Sequence[str]
) -> float | None:
    """The most such requests at any scrape (a page without the gauge says nothing)."""
    held = [h for p in pages if (h := _held(p, name, label, values)) is not None]
    return max(held) if held else None


def _time_share(
    pages: Sequence[Exposition], name: str, label: str, values: Sequence[str]
) -> float | None:
    """Such requests over every request in the engine (running + waiting), summed over the
    scrapes that have both: the share of the requests' time in the engine, as sampled. 0 when
    the engine exposes the gauge and held no request at any scrape; None without it."""
    held = total = 0.0
    seen = False
    for page in pages:
        part = _held(page, name, label, values)
        running, waiting = page.total(RUNNING[0]), page.total(WAITING[0])
        if part is None or running is None or waiting is None:
            continue
        seen = True
        held, total = held + part, total + running + waiting
    if not seen:
        return None
    return min(held / total, 1.0) if total > 0 else 0.0


@dataclass(frozen=True)
class _Lora:
    """LoRA adapter states over a window, from ``vllm:lora_requests_info`` (module docstring)."""

    waiting: float  # the most adapters waiting for a slot at once
    swaps: float  # adapters that took a slot another held, at least

    @classmethod
    def read(cls, before: Exposition, after: Exposition) -> _Lora | None:
        """The most adapters waiting for a slot, and the swaps the window needed at least, of
        any engine on the page (merged pages: each replica's states apart); None when the
        engine exposes no LoRA states."""
        name = LORA_INFO[0]
        if not after.has(name):
            return None
        start: dict[tuple[tuple[str, str], ...], tuple[Labels, float]] = {}
        for labels, value in before.samples.get(name, []):
            engine = _engine_of(labels)
            if engine not in start or value > start[engine][1]:
                start[engine] = (labels, value)  # the state current at the window's start
        earlier = {_key(labels): value for labels, value in before.samples.get(name, [])}
        ran: dict[tuple[tuple[str, str], ...], set[str]] = defaultdict(set)
        slots: dict[tuple[tuple[str, str], ...], int] = {}
        waiting = 0.0
        for labels, value in after.samples[name]:
            if value <= earlier.get(_key(labels), float("-inf")):
                continue  # a state the engine was not in during the window
            engine, running = _engine_of(labels), _adapters(labels, "running_lora_adapters")
            most = _max_lora(labels)
            if most is None:
                continue
            slots[engine] = most
            ran[engine] |= running
            blocked = _adapters(labels, "waiting_lora_adapters") - running
            waiting = max(waiting, float(len(blocked)) if len(running) >= most else 0.0)
        swaps = 0.0
        for engine, adapters in ran.items():
            if engine in start:
                adapters |= _adapters(start[engine][0], "running_lora_adapters")
            swaps = max(swaps, float(len(adapters) - slots[engine]))
        return cls(waiting, swaps)


def _key(labels: Labels) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _engine_of(labels: Labels) -> tuple[tuple[str, str], ...]:
    """The labels that tell one engine's states from another's (replica, process)."""
    return tuple(sorted((k, v) for k, v in labels.items() if k not in LORA_LABELS))


def _adapters(labels: Labels, label: str) -> set[str]:
    return {name for name in labels.get(label, "").split(",") if name}


def _max_lora(labels: Mapping[str, str]) -> int | None:
    try:
        return int(labels["max_lora"])
    except (KeyError, ValueError):
        return None


def _ratio(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else part / whole
