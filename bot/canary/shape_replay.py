"""Turns a workload shape into what the canary sends: per-request plans and arrival gaps.

Seeded and deterministic: the same shape, seed and engine limits give the same lengths, prefixes
and gaps in the same order (the unique rest of each prompt also depends on a ``salt``, which the
runner draws for every run so that no run is served from an earlier one's prefix cache).
docs/workload.md ("Replay") says the same for a person:

- **Lengths.** Per request a prompt bucket is chosen by its share, then a length uniformly in
  (previous edge, edge]; output lengths likewise (sent as ``max_tokens`` with ``ignore_eos``).
  The +Inf bucket has no upper edge: it is replayed as one more bucket as wide as the last
  finite one, and a note says so. Buckets are chosen *stratified*: every block of requests (the
  run's count, or ``PLAN_BLOCK`` when it runs for a duration) holds each bucket its share of
  times (largest remainder), shuffled, so a short run does not wander off the shape by chance.
  Prompt + output are clamped to the engine's ``max_model_len`` (output first, to at most
  ``max_model_len - 1``; then the prompt to ``max_model_len - output``), and a warning says how
  many requests it changed.
- **Declared prefix groups** (``prefix.groups``): each group one fixed random prefix of its
  length, the first tokens of that share of the requests (stratified like the buckets). A
  request drawn shorter than its group's prefix shares only its first ``n - 1`` tokens of it
  (vLLM always computes a prompt's last token), and a warning counts those.
- **A hit rate only** (a capture from /metrics): one fixed random "system prompt", of which
  each request begins with the first ``L`` tokens, ``L`` a whole number of the engine's KV
  blocks (vLLM's prefix cache hits whole blocks only) and at most ``n - 1``. ``L`` is
  proportional to the longest such prefix the request can hold, with the rounding to blocks
  carried from one request to the next, so that the block's hits add up to ``hit_rate`` x its
  prompt tokens. The first request of a run finds the cache cold (each run's prompts are its
  own): it carries the longest prefix and is left out of the sum, so the run as a whole still
  reads about ``hit_rate``.
- **Arrivals**: gaps gamma-distributed with the shape's burstiness as the gamma shape (1, i.e.
  Poisson, when ``null``) and mean ``1 / request_rate``; each block of gaps is scaled so its
  mean is exactly ``1 / request_rate``, so the rate a short run delivers is the shape's.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bot.adr.workload import (
    Arrivals,
    Lengths,
    Prefix,
    PrefixGroup,
    WorkloadShape,
    edge_text,
    new_shape,
    parse_edge,
)
from bot.canary.plan import Plan
from bot.canary.workload import PROMPT_ID_RANGE, Workload
from bot.kernel import UsageError

# vLLM's KV block on GPUs; vLLM CPU uses 128. The runner reads the engine's own from /metrics
# (vllm:cache_config_info) and falls back to this, saying so.
DEFAULT_BLOCK_SIZE = 16
# vLLM's length histograms have 1-2-5 edges up to max_model_len; when that is unknown, up to
# 10,000 (what a 16k-context engine shows).
DEFAULT_EDGE_CAP = 10_000
PLAN_BLOCK = 100  # requests per stratified block when the run's count is not known
MAX_PLAN_BLOCK = 10_000
FIXED_SOURCE = "canary fixed workload"
# The in-flight cap when --concurrency is not given: this many times the shape's mean
# concurrency, at least MIN_CAP (the canary's own default), so the cap does not shape arrivals.
CAP_PER_RUNNING = 4
MIN_CAP = 10


def length_edges(max_model_len: int | None = None) -> list[float]:
    """vLLM's request-length histogram edges: 1, 2, 5, 10, ... up to max_model_len, then +Inf."""
    top = max_model_len or DEFAULT_EDGE_CAP
    edges: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > top:
                return [*edges, math.inf]
            edges.append(float(value))
        exponent += 1


def _point(value: float, *, count: int, edges: Sequence[float]) -> Lengths:
    """All ``count`` requests in the bucket that holds ``value``."""
    target = next(edge for edge in edges if value <= edge)
    buckets = {edge_text(edge): 1.0 if edge == target else 0.0 for edge in edges}
    return Lengths(count=count, mean=float(value), buckets=buckets)


def fixed_shape(
    workload: Workload,
    *,
    request_rate: float | None = None,
    count: int | None = None,
    max_model_len: int | None = None,
    captured_at: datetime | None = None,
) -> WorkloadShape:
    """The shape a fixed workload describes: every prompt and output in one bucket of vLLM's
    edges, one prefix group of ``prefix_length`` shared by all, arrivals from --request-rate
    (Poisson) or, at fixed concurrency, the streams and the rate the run measured
    (``request_rate``; ValueError without one)."""
    edges = length_edges(max_model_len)
    n = max(count or workload.num_requests or 1, 1)
    if workload.request_rate is not None:
        rate, concurrency, burstiness = workload.request_rate, None, 1.0
    else:
        if request_rate is None or request_rate <= 0:
            raise ValueError("the shape of a fixed-concurrency run needs its measured rate")
        rate, burstiness = request_rate, None
        concurrency = float(workload.concurrency)
        if workload.pulse_period_s is not None:  # the streams' mean over a period
            base, burst = workload.base_streams(), workload.pulse_width_s / workload.pulse_period_s
            concurrency = base + (workload.concurrency - base) * burst
    shared = workload.prefix_length
    groups = (PrefixGroup(share=1.0, length=shared),) if shared > 0 else ()
    return new_shape(
        source=FIXED_SOURCE,
        captured_at=captured_at or datetime.now(UTC),
        api=workload.api.value,
        prompt_tokens=_point(workload.prompt_length, count=n, edges=edges),
        output_tokens=_point(workload.output_length, count=n, edges=edges),
        prefix=Prefix(groups=groups),
        arrivals=Arrivals(
            request_rate=round(rate, 6),
            concurrency=None if concurrency is None else round(concurrency, 3),
            burstiness=burstiness,
        ),
    )


def default_cap(shape: WorkloadShape) -> int:
    """In-flight cap for a replay without --concurrency: room for the shape's own bursts."""
    running = shape.arrivals.concurrency
    return max(MIN_CAP, math.ceil(CAP_PER_RUNNING * running)) if running else MIN_CAP


@dataclass(frozen=True)
class _Bucket:
    """A bucket to sample from: its share and the integer lengths inside it."""

    share: float
    low: int
    high: int


def _buckets(lengths: Lengths, what: str) -> tuple[list[_Bucket], list[str]]:
    """The buckets with a share, as integer ranges; notes on the +Inf bucket's range."""
    notes: list[str] = []
    out: list[_Bucket] = []
    previous = 0.0
    finite = [edge for edge in lengths.edges() if not math.isinf(edge)]
    for key, share in lengths.buckets.items():
        edge = parse_edge(key)
        if math.isinf(edge):
            if share <= 0:
                continue
            if not finite:
                raise UsageError(
                    f"{what}: only a +Inf bucket, no length to replay; the shape needs a "
                    "finite bucket edge"
                )
            last = finite[-1]
            width = last - (finite[-2] if len(finite) > 1 else 0.0)
            low, high = math.floor(last) + 1, math.floor(last + width)
            notes.append(
                f"{what}: {share:.1%} of the requests are longer than {last:,.0f} tokens (the "
                f"+Inf bucket); replayed as {low:,}-{high:,} tokens, as wide as the last "
                "finite bucket"
            )
        else:
            low = math.floor(previous) + 1
            high = max(math.floor(edge), low)
            previous = edge
        if share > 0:
            out.append(_Bucket(share, low, high))
    return out, notes


def stratified(shares: Sequence[float], n: int, rng: random.Random) -> list[int]:
    """``n`` indexes into ``shares``, each about share x n times (largest remainder), shuffled."""
    total = math.fsum(shares)
    quotas = [share / total * n for share in shares]
    counts = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(shares)), key=lambda i: counts[i] - quotas[i])
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    picks = [i for i, c in enumerate(counts) for _ in range(c)]
    rng.shuffle(picks)
    return picks


class ShapeReplay:
    """Plans and gaps for replaying ``shape`` (the module docstring: how).

    ``count``: the requests the run will send, when known (each stratified block is that
    long); ``max_model_len``: the engine's, to clamp to; ``block_size``: the engine's KV
    block, for prefixes synthesized from a hit rate. ``stream`` names an independent draw of
    lengths and gaps with the same prefixes (the warmup's, beside the measured run's).
    ``salt`` changes the prompts' tokens, not their lengths: the runner gives every run its
    own, so that a replay does not find an earlier run's prompts or prefixes in the prefix
    cache. ``warm``: the prefixes were sent before (a warmup with the same salt), so the first
    request is not a cold miss.
    """

    def __init__(
        self,
        shape: WorkloadShape,
        *,
        seed: int = 0,
        count: int | None = None,
        max_model_len: int | None = None,
        block_size: int | None = None,
        stream: str = "measured",
        salt: str = "",
        warm: bool = False,
    ) -> None:
        self.shape = shape
        self.seed = seed
        self.max_model_len = max_model_len
        self.block_size = block_size or DEFAULT_BLOCK_SIZE
        self._block = min(count, MAX_PLAN_BLOCK) if count else PLAN_BLOCK
        self._prompts, prompt_notes = _buckets(shape.prompt_tokens, "prompt_tokens")
        self._outputs, output_notes = _buckets(shape.output_tokens, "output_tokens")
        self.notes = prompt_notes + output_notes
        self._rng = random.Random(f"{seed}:{stream}:lengths")
        self._gap_rng = random.Random(f"{seed}:{stream}:gaps")
        self._suffix_rng = random.Random(f"{seed}:{stream}:{salt}:suffixes")
        self._ids = range(*PROMPT_ID_RANGE)
        self.groups: tuple[PrefixGroup, ...] = shape.prefix.groups
        self._group_ids = [
            random.Random(f"{seed}:{salt}:group{i}").choices(self._ids, k=group.length)
            for i, group in enumerate(self.groups)
        ]
        hit_rate = shape.prefix.hit_rate
        self.synthesized = not self.groups and bool(hit_rate)
        self.construction = (
            "declared groups"
            if self.groups
            else "synthesized from hit_rate"
            if self.synthesized
            else "none"
        )
        self._master_rng = random.Random(f"{seed}:{salt}:system-prompt")
        self._master: list[int] = []
        self._plans: deque[Plan] = deque()
        self._gaps: deque[float] = deque()
        self._cold = not warm  # the run's first request finds no prefix of ours cached
        # What was planned, for the report and the warnings.
        self.planned = 0
        self.prompt_tokens = 0
        self.planned_hits = 0  # tokens a warm prefix cache would hit
        self.clamped_prompts = 0
        self.clamped_outputs = 0
        self.truncated = [0] * len(self.groups)  # per group: requests shorter than its prefix
        self.group_counts = [0] * len(self.groups)
        self.synthesized_lengths: dict[int, int] = {}  # prefix length -> requests
        self.shortfall: float | None = None  # the highest hit rate reachable, when below

    # -- requests ------------------------------------------------------------------------
    def plan(self) -> Plan:
        """The next request."""
        if not self._plans:
            self._plans.extend(self._draw(self._block))
        return self._plans.popleft()

    def _draw(self, n: int) -> list[Plan]:
        rng = self._rng
        outputs = [
            rng.randint(self._outputs[i].low, self._outputs[i].high)
            for i in stratified([b.share for b in self._outputs], n, rng)
        ]
        prompts = [
            rng.randint(self._prompts[i].low, self._prompts[i].high)
            for i in stratified([b.share for b in self._prompts], n, rng)
        ]
        if self.max_model_len:
            for i in range(n):
                if outputs[i] > self.max_model_len - 1:
                    outputs[i] = self.max_model_len - 1
                    self.clamped_outputs += 1
                if prompts[i] > self.max_model_len - outputs[i]:
                    prompts[i] = self.max_model_len - outputs[i]
                    self.clamped_prompts += 1
        if self.groups:
            shares = [g.share for g in self.groups]
            rest = max(1.0 - math.fsum(shares), 0.0)
            groups: list[int | None] = [
                None if i == len(shares) else i for i in stratified([*shares, rest], n, rng)
            ]
            triples = zip(prompts, outputs, groups, strict=True)
            plans = [self._grouped(p, o, g) for p, o, g in triples]
        elif self.synthesized:
            plans = self._synthesized(prompts, outputs)
        else:
            plans = [Plan(self._suffix(p), o) for p, o in zip(prompts, outputs, strict=True)]
        self.planned += n
        self.prompt_tokens += sum(prompts)
        return plans

    def _suffix(self, n: int) -> list[int]:
        return self._suffix_rng.choices(self._ids, k=n)

    def _hits(self, shared: int) -> int:
        return shared // self.block_size * self.block_size

    def _grouped(self, prompt: int, output: int, group: int | None) -> Plan:
        if group is None:
            return Plan(self._suffix(prompt), output)
        prefix = self._group_ids[group]
        shared = min(len(prefix), prompt - 1)
        self.group_counts[group] += 1
        if shared < len(prefix):
            self.truncated[group] += 1
        self.planned_hits += self._hits(shared)
        return Plan(prefix[:shared] + self._suffix(prompt - shared), output, shared, group)

    def _synthesized(self, prompts: list[int], outputs: list[int]) -> list[Plan]:
        """Nested prefixes of one system prompt whose hits add up to hit_rate x the prompts."""
        b = self.block_size
        n = len(prompts)
        caps = [(p - 1) // b * b for p in prompts]  # the longest whole-block prefix each holds
        order = list(range(n))
        if self._cold:  # the longest goes first: it fills the cache for all that follow
            first = max(order, key=lambda i: caps[i])
            order.remove(first)
            order.insert(0, first)
        counted = order[1:] if self._cold else order
        target = (self.shape.prefix.hit_rate or 0.0) * sum(prompts)
        room = sum(caps[i] for i in counted)
        fraction = min(target / room, 1.0) if room else 0.0
        if target > room:
            reach = room / sum(prompts)
            self.shortfall = reach if self.shortfall is None else min(self.shortfall, reach)
        lengths = [0] * n
        carry = 0.0
        for i in counted:
            want = fraction * caps[i] + carry
            lengths[i] = min(caps[i], max(0, round(want / b)) * b)
            carry = want - lengths[i]
        cold = order[0] if self._cold else None
        if cold is not None:
            lengths[cold] = caps[cold]
            self._cold = False
        longest = max(lengths, default=0)
        if longest > len(self._master):
            self._master += self._master_rng.choices(self._ids, k=longest - len(self._master))
        plans = []
        for i in order:
            shared = lengths[i]
            if shared:
                self.synthesized_lengths[shared] = self.synthesized_lengths.get(shared, 0) + 1
            self.planned_hits += shared if i != cold else 0
            ids = self._master[:shared] + self._suffix(prompts[i] - shared)
            plans.append(Plan(ids, outputs[i], shared))
        return plans

    # -- arrivals ------------------------------------------------------------------------
    def gap(self) -> float:
        """Seconds to wait before the next request."""
        if not self._gaps:
            self._gaps.extend(self._draw_gaps(self._block))
        return self._gaps.popleft()

    def _draw_gaps(self, n: int) -> list[float]:
        rate = self.shape.arrivals.request_rate
        k = self.shape.arrivals.burstiness or 1.0
        gaps = [self._gap_rng.gammavariate(k, 1.0 / (k * rate)) for _ in range(n)]
        total = math.fsum(gaps)
        scale = n / rate / total if total > 0 else 1.0
        return [gap * scale for gap in gaps]

    # -- what it did ---------------------------------------------------------------------
    def planned_hit_rate(self) -> float | None:
        """Hits a warm prefix cache gives the planned requests, over their prompt tokens."""
        return self.planned_hits / self.prompt_tokens if self.prompt_tokens else None

    def warnings(self) -> list[str]:
        """Where the replay departs from the shape (said beside the numbers)."""
        out = list(self.notes)
        if self.clamped_prompts or self.clamped_outputs:
            out.append(
                f"clamped {self.clamped_prompts} of {self.planned} prompts"
                + (f" and {self.clamped_outputs} outputs" if self.clamped_outputs else "")
                + f" to the engine's max_model_len {self.max_model_len:,} (prompt + output): "
                "the replayed lengths are shorter than the shape's"
            )
        for i, group in enumerate(self.groups):
            if self.truncated[i]:
                out.append(
                    f"prefix group {i + 1} ({group.length:,} tokens): {self.truncated[i]} of its "
                    f"{self.group_counts[i]} requests were drawn shorter than the prefix and "
                    "share only their first n - 1 tokens of it"
                )
        if self.shortfall is not None:
            out.append(
                f"the shape's prefix-cache hit rate {self.shape.prefix.hit_rate:.1%} is above "
                f"what whole {self.block_size}-token blocks inside the prompts can hit "
                f"({self.shortfall:.1%}); replaying that"
            )
        return out

    def describe(self) -> dict[str, Any]:
        """How the shape was replayed, for the JSON report."""
        if self.groups:
            groups = [{"share": g.share, "length": g.length} for g in self.groups]
        else:
            total = max(self.planned, 1)
            groups = [
                {"share": round(c / total, 6), "length": length}
                for length, c in sorted(self.synthesized_lengths.items())
            ]
        planned = self.planned_hit_rate()
        return {
            "source": self.shape.source,
            "seed": self.seed,
            "max_model_len": self.max_model_len,
            "block_size": self.block_size,
            "requests_per_s": self.shape.arrivals.request_rate,
            "burstiness": self.shape.arrivals.burstiness,
            "prefix": {
                "construction": self.construction,
                "target_hit_rate": self.shape.prefix.hit_rate,
                "planned_hit_rate": None if planned is None else round(planned, 4),
                "system_prompt_tokens": len(self._master) if self.synthesized else None,
                "groups": groups,
            },
            "planned": self.planned,
            "clamped_prompts": self.clamped_prompts,
            "clamped_outputs": self.clamped_outputs,
        }
