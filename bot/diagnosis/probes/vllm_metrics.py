"""The vLLM metrics probe: scrape /metrics, and read an engine window from two scrapes.

Metric names moved across vLLM versions; each reading lists its names newest first and takes
the first one the page exposes. Counters and histograms are read as deltas between two
scrapes, so a window says what happened between them, not since the engine started.

Goodput and wasted prefill count only requests that *ended* in the window. vLLM counts a
request's prompt in ``prompt_tokens_total`` at its first token and its output in
``generation_tokens_total`` as it is generated, but in the ``request_*_tokens`` histograms
only when it finishes, and an aborted one never (v1 ``OutputProcessor.abort_requests``). So
over a window, with I(t) the tokens of the requests in flight at scrape t:

    aborted = Δcounter − Δfinished_sum − (I(end) − I(start))

and a request still running at the end is neither goodput nor waste. I(t) is not exposed;
it is estimated, with stated error bounds, from the gauges at the two scrapes:

- in-flight prompt + generated tokens = the KV slots the running requests hold:
  used_blocks × B, less 0..B−1 empty slots in each running sequence's last block, plus the
  one newest token per sequence that has no KV yet (midpoint taken, the rest is the bound);
  more slack where blocks may be shared (prefix-cache hits in the window) or requests sit
  preempted in the queue without KV (preemptions, requests waiting);
- in-flight prompt tokens = running × the mean prompt of the window's finished requests
  (bound: the gap to the mean prompt of the requests that started in it, times the change in
  running requests). The in-flight generated tokens are the difference.
- counts: aborted requests = running(start) + first tokens − finished − running(end); when
  that is at most 0, nothing was aborted after its first token and nothing was wasted.

goodput = finished output / (finished output + aborted output) over the requests that ended;
wasted-prefill share = aborted prompt tokens / all prompt tokens prefilled in the window (as
the shipped VLLMWastedPrefillHigh alert reads it). Each is an ``Estimate`` (value, low, high,
basis); the value is None, with the reason in ``basis``, when nothing ended or the bounds are
too wide to tell (the window was too short against what was in flight). Blind spots: a request
mid-prefill at a scrape counts as running before its prompt is counted, and a request aborted
before its first token shows in no counter at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.fragmentation import used_blocks
from bot.kernel import EndpointError, ProbeError
from bot.kernel.numbers import Bound, Estimate, Reading, histogram_quantile, quantile_bound
from bot.kernel.runtime.redact import redact

# Each reading: its names, newest first.
TTFT = ("vllm:time_to_first_token_seconds",)
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
QUEUE_TIME = ("vllm:request_queue_time_seconds",)
E2E = ("vllm:e2e_request_latency_seconds",)
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREEMPTIONS = ("vllm:num_preemptions_total", "vllm:num_preemptions")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
NOT_STORED = "not in this report (stored by an earlier release)"
PREFIX_HIT_RATE = ("vllm:gpu_prefix_cache_hit_rate",)  # older engines: a gauge, not counters
GENERATION_TOKENS = ("vllm:generation_tokens_total",)
PROMPT_TOKENS = ("vllm:prompt_tokens_total",)
REQUEST_PROMPT_TOKENS_SUM = ("vllm:request_prompt_tokens_sum",)
REQUEST_GENERATION_TOKENS_SUM = ("vllm:request_generation_tokens_sum",)
REQUEST_PROMPT_TOKENS_COUNT = ("vllm:request_prompt_tokens_count",)  # requests that finished
PROMPT_LENGTHS = ("vllm:request_prompt_tokens",)  # the histogram: its buckets bound a mix
OUTPUT_LENGTHS = ("vllm:request_generation_tokens",)
REQUEST_SUCCESS = ("vllm:request_success_total",)
CACHE_CONFIG = ("vllm:cache_config_info",)

# What a window needs, and what an in-flight sample needs: scrapes parse only these.
WINDOW_METRICS = frozenset(
    name
    for names in (
        TTFT, ITL, QUEUE_TIME, E2E, RUNNING, WAITING, KV_USAGE, PREEMPTIONS, PREFIX_QUERIES,
        PREFIX_HITS, PREFIX_HIT_RATE, GENERATION_TOKENS, PROMPT_TOKENS, REQUEST_PROMPT_TOKENS_SUM,
        REQUEST_GENERATION_TOKENS_SUM, REQUEST_PROMPT_TOKENS_COUNT, PROMPT_LENGTHS, REQUEST_SUCCESS,
        CACHE_CONFIG,
    )
    for name in names
)  # fmt: skip
SAMPLE_METRICS = frozenset((*RUNNING, *WAITING, *KV_USAGE, *GENERATION_TOKENS))


@dataclass(frozen=True)
class Quantiles:
    """Latency quantiles in milliseconds (None where there was no observation).

    A quantile that fell in the histogram's lowest or +Inf bucket is only a bound: its value is
    that bucket's edge and ``bounds`` says which way ("p99": Bound.AT_MOST).
    """

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None
    count: int
    bounds: Mapping[str, Bound] = field(default_factory=dict)

    def reading(self, name: str) -> Reading | None:
        """One quantile ("p99") with its bound; None where there was no observation."""
        value = getattr(self, name)
        return None if value is None else Reading(value, self.bounds.get(name))

    @classmethod
    def from_histogram(
        cls, before: Exposition, after: Exposition, names: Sequence[str], *, zeros: float = 0.0
    ) -> Quantiles:
        """Quantiles of the observations a histogram gained between two scrapes; ``zeros``
        of them, observed as exactly 0 and meaning "no value", are left out (they sit in every
        cumulative bucket)."""
        name = after.first_present(f"{n}_bucket" for n in names)
        if name is None:
            return cls(None, None, None, None, 0)
        base = name.removesuffix("_bucket")
        b1, b0 = after.buckets(base), before.buckets(base)
        delta = {le: max(c - b0.get(le, 0.0) - zeros, 0.0) for le, c in b1.items()}
        count = (after.total(f"{base}_count") or 0.0) - (before.total(f"{base}_count") or 0.0)
        count = max(count - zeros, 0.0)
        total = (after.total(f"{base}_sum") or 0.0) - (before.total(f"{base}_sum") or 0.0)

        bounds = {
            name: bound
            for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
            if (bound := quantile_bound(q, delta)) is not None
        }
        lowest = min(delta, default=0.0)

        def ms(name: str, q: float) -> float | None:
            value = histogram_quantile(q, delta)
            if value is not None and bounds.get(name) is Bound.AT_MOST:
                value = lowest  # "at most the first edge", not a point inside [0, edge]
            return None if value is None else value * 1000.0

        return cls(
            p50=ms("p50", 0.5),
            p90=ms("p90", 0.9),
            p99=ms("p99", 0.99),
            mean=total / count * 1000.0 if count > 0 else None,
            count=int(round(count)),
            bounds=bounds,
        )


@dataclass(frozen=True)
class CacheConfig:
    """KV-cache geometry from vllm:cache_config_info."""

    block_size: int
    num_gpu_blocks: int


# A ratio whose bounds span more than this is not reported: the window was too short to tell.
MAX_RATIO_SPREAD = 0.2
# Finished prompts spanning more than this factor: a mix whose in-flight share cannot be split.
MIX_RANGE = 4.0


@dataclass(frozen=True)
class EngineWindow:
    """What the engine's own /metrics say happened between two scrapes."""

    duration_s: float
    ttft_ms: Quantiles
    itl_ms: Quantiles
    queue_time_ms: Quantiles
    e2e_ms: Quantiles
    requests_running: float | None
    requests_waiting: float | None
    kv_cache_usage: float | None
    preemptions_per_s: float | None
    prefix_cache_hit_rate: float | None
    generation_tokens: float | None
    prompt_tokens: float | None
    generation_tokens_per_s: float | None
    finished_generation_tokens: float | None
    goodput_ratio: float | None  # goodput.value
    wasted_prefill_tokens: float | None  # wasted_prefill.value
    requests_finished: float | None
    cache: CacheConfig | None
    # Over the requests that ended in the window (module docstring): estimates with bounds.
    # Defaults: unknown, as a report stored by a release before them reads back.
    goodput: Estimate = field(default_factory=lambda: Estimate.unknown(NOT_STORED))
    wasted_generation: Estimate = field(default_factory=lambda: Estimate.unknown(NOT_STORED))
    wasted_prefill: Estimate = field(default_factory=lambda: Estimate.unknown(NOT_STORED))
    wasted_prefill_share: Estimate = field(default_factory=lambda: Estimate.unknown(NOT_STORED))
    aborted_requests: float | None = None  # aborted after a first token (module docstring)


def is_vllm(page: Exposition) -> bool:
    """Whether a scrape looks like a vLLM engine's /metrics (it exposes the token counters)."""
    return page.first_present(GENERATION_TOKENS) is not None


def cache_config(page: Exposition) -> CacheConfig | None:
    """Block size and block count, when the engine exposes vllm:cache_config_info."""
    name = page.first_present(CACHE_CONFIG)
    if name is None:
        return None
    for labels in page.labels_of(name):
        try:
            return CacheConfig(
                block_size=int(labels["block_size"]), num_gpu_blocks=int(labels["num_gpu_blocks"])
            )
        except (KeyError, ValueError):
            continue
    return None


def gauge(page: Exposition, names: Sequence[str]) -> float | None:
    """A gauge summed over label sets (e.g. over engines), None when not exposed: right for
    counts (requests running, waiting), wrong for shares (KV usage: ``kv_usage``)."""
    name = page.first_present(names)
    return None if name is None else page.total(name)


def kv_usage(page: Exposition) -> float | None:
    """The KV-cache usage of the fullest engine on the page (data-parallel engines, merged
    replicas): the one that preempts first. A sum of shares would exceed 1."""
    name = page.first_present(KV_USAGE)
    if name is None:
        return None
    return max((value for _, value in page.samples[name]), default=0.0)


# Labels that tell one engine from another on a page (merged pages add replica and process).
ENGINE_KEYS = ("engine", "replica", "process")


def kv_blocks_used(page: Exposition) -> int | None:
    """KV blocks in use over every engine on the page, each from its own usage and pool size;
    None without a KV usage gauge or vllm:cache_config_info."""
    name, info = page.first_present(KV_USAGE), page.first_present(CACHE_CONFIG)
    if name is None or info is None:
        return None
    configs = page.labels_of(info)
    total = 0
    for labels, value in page.samples[name]:
        same = [c for c in configs if all(c.get(k) == labels.get(k) for k in ENGINE_KEYS)]
        blocks = _num_blocks(same or configs)
        if blocks is None:
            return None
        total += used_blocks(value, blocks)
    return total


def _num_blocks(configs: Sequence[Mapping[str, str]]) -> int | None:
    for labels in configs:
        try:
            return int(labels["num_gpu_blocks"])
        except (KeyError, ValueError):
            continue
    return None


def counter_delta(before: Exposition, after: Exposition, names: Sequence[str]) -> float | None:
    """How much a counter grew between two scrapes; None if either scrape lacks it."""
    name = after.first_present(names)
    if name is None or not before.has(name):
        return None
    v1, v0 = after.total(name), before.total(name)
    assert v1 is not None and v0 is not None
    return max(v1 - v0, 0.0)  # a restart resets counters: never report negative work


def _total(page: Exposition, names: Sequence[str]) -> float | None:
    """A counter's value since the engine started; None if the page lacks it."""
    name = page.first_present(names)
    return None if name is None else page.total(name)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def read_window(before: Exposition, after: Exposition) -> EngineWindow:
    """The engine-side view of the window between two scrapes of the same engine."""
    duration = max(after.at - before.at, 1e-9)
    generated = counter_delta(before, after, GENERATION_TOKENS)
    prompt = counter_delta(before, after, PROMPT_TOKENS)
    finished_generated = counter_delta(before, after, REQUEST_GENERATION_TOKENS_SUM)
    preemptions = counter_delta(before, after, PREEMPTIONS)
    hits = counter_delta(before, after, PREFIX_HITS)
    queries = counter_delta(before, after, PREFIX_QUERIES)
    hit_rate = _ratio(hits, queries)
    if hit_rate is None and queries is None:
        hit_rate = gauge(after, PREFIX_HIT_RATE)
    waste = _Waste.read(before, after)
    return EngineWindow(
        duration_s=duration,
        ttft_ms=Quantiles.from_histogram(before, after, TTFT),
        itl_ms=Quantiles.from_histogram(before, after, ITL),
        queue_time_ms=Quantiles.from_histogram(before, after, QUEUE_TIME),
        e2e_ms=Quantiles.from_histogram(before, after, E2E),
        requests_running=gauge(after, RUNNING),
        requests_waiting=gauge(after, WAITING),
        kv_cache_usage=kv_usage(after),
        preemptions_per_s=None if preemptions is None else preemptions / duration,
        prefix_cache_hit_rate=hit_rate,
        generation_tokens=generated,
        prompt_tokens=prompt,
        generation_tokens_per_s=None if generated is None else generated / duration,
        finished_generation_tokens=finished_generated,
        goodput_ratio=waste.goodput.value,
        wasted_prefill_tokens=waste.prefill.value,
        requests_finished=counter_delta(before, after, REQUEST_SUCCESS),
        cache=cache_config(after),
        goodput=waste.goodput,
        wasted_generation=waste.generation,
        wasted_prefill=waste.prefill,
        wasted_prefill_share=waste.prefill_share,
        aborted_requests=waste.aborted,
    )


@dataclass(frozen=True)
class _InFlight:
    """What the gauges of one scrape say is in flight (module docstring)."""

    running: float
    maybe_preempted: float  # queued requests that may hold counted tokens but no KV
    tokens: float | None  # prompt + generated tokens of the running requests (bound midpoint)
    tokens_error: float  # half-width of that bound
    unknown: str = ""  # why ``tokens`` is None

    @classmethod
    def read(cls, page: Exposition) -> _InFlight | None:
        """The in-flight reading; None without a running gauge."""
        running = gauge(page, RUNNING)
        if running is None:
            return None
        preempted = (gauge(page, WAITING) or 0.0) if (gauge(page, PREEMPTIONS) or 0.0) else 0.0
        if running <= 0:
            return cls(0.0, preempted, 0.0, 0.0)
        blocks, cache = kv_blocks_used(page), cache_config(page)
        if blocks is None or cache is None:
            why = "requests were in flight and the engine exposes no KV usage or block size"
            return cls(running, preempted, None, 0.0, why)
        if blocks < running:
            why = f"{running:g} requests running in {blocks} KV blocks: the gauges disagree"
            return cls(running, preempted, None, 0.0, why)
        b = cache.block_size
        # Each running sequence: 0..B-1 empty slots in its last block, plus its newest token,
        # which is counted but has no KV until the next step feeds it in.
        low, high = blocks * b - running * (b - 1), blocks * b + running
        return cls(running, preempted, (low + high) / 2, (high - low) / 2)


@dataclass(frozen=True)
class _Window:
    """The counter deltas and in-flight gauges of one window: read once, for _Waste's steps."""

    generated: float
    prompt: float
    done_prompt: float  # prompt tokens of the requests that finished
    done_output: float  # output tokens of the requests that finished
    finished: float
    first_tokens: float | None
    prefix_hits: float
    lifetime_hits_per_request: float  # the engine's mean prefix hits per request, since start
    prompt_range: tuple[float, float]  # _prompt_range
    start: _InFlight
    end: _InFlight

    @classmethod
    def read(cls, before: Exposition, after: Exposition) -> _Window | Estimate:
        """The window's readings, or why the engine's page cannot give them (unknown)."""
        generated = counter_delta(before, after, GENERATION_TOKENS)
        prompt = counter_delta(before, after, PROMPT_TOKENS)
        done_prompt = counter_delta(before, after, REQUEST_PROMPT_TOKENS_SUM)
        done_output = counter_delta(before, after, REQUEST_GENERATION_TOKENS_SUM)
        start, end = _InFlight.read(before), _InFlight.read(after)
        if generated is None or prompt is None or done_prompt is None or done_output is None:
            return Estimate.unknown("the engine exposes no token counters and request histograms")
        if start is None or end is None:
            return Estimate.unknown("the engine exposes no vllm:num_requests_running")
        finished = counter_delta(before, after, REQUEST_PROMPT_TOKENS_COUNT)
        if finished is None:
            finished = counter_delta(before, after, REQUEST_SUCCESS) or 0.0
        return cls(
            generated, prompt, done_prompt, done_output, finished,
            first_tokens=counter_delta(before, after, tuple(f"{n}_count" for n in TTFT)),
            prefix_hits=counter_delta(before, after, PREFIX_HITS) or 0.0,
            lifetime_hits_per_request=(_total(after, PREFIX_HITS) or 0.0)
            / max(_total(after, tuple(f"{n}_count" for n in TTFT)) or 0.0, 1.0),
            prompt_range=_prompt_range(before, after),
            start=start, end=end,
        )  # fmt: skip

    @property
    def ends(self) -> str:
        """The running requests at both ends, for the bases."""
        return (
            f"in flight at the window's ends: {self.start.running:g} -> {self.end.running:g} "
            "running"
        )

    @property
    def preempted(self) -> float:
        """Queued requests at either end that may hold counted tokens but no KV."""
        return self.start.maybe_preempted + self.end.maybe_preempted

    @property
    def change(self) -> float:
        """How many more requests were running at the end than at the start."""
        return self.end.running - self.start.running

    @property
    def hits_per_request(self) -> float:
        """Mean prefix-cache hits (tokens) of a request: of those that started in the window,
        or, where none did, of every request since the engine started."""
        if self.first_tokens:
            return self.prefix_hits / self.first_tokens
        return self.lifetime_hits_per_request

    @property
    def started_prompt(self) -> float | None:
        """The mean prompt of the requests that had their first token in the window."""
        return self.prompt / self.first_tokens if self.first_tokens else None


@dataclass(frozen=True)
class _Waste:
    """Goodput and wasted tokens over the requests that ended in a window."""

    goodput: Estimate
    generation: Estimate
    prefill: Estimate
    prefill_share: Estimate
    aborted: float | None

    @classmethod
    def of(
        cls, done_output: float, generation: Estimate, prompt: float, prefill: Estimate,
        aborted: float | None,
    ) -> _Waste:  # fmt: skip
        """The shares from the wasted tokens."""
        goodput = _good_share(done_output, generation, "output tokens")
        return cls(goodput, generation, prefill, _prefill_share(prefill, prompt), aborted)

    @classmethod
    def unknown(cls, why: str, aborted: float | None) -> _Waste:
        """A window whose waste cannot be told, every share for the same reason."""
        none = Estimate.unknown(why)
        return cls(none, none, none, none, aborted)

    @classmethod
    def read(cls, before: Exposition, after: Exposition) -> _Waste:
        """Read the window between two scrapes (the module docstring has the method)."""
        w = _Window.read(before, after)
        if isinstance(w, Estimate):
            return cls(w, w, w, w, None)
        # Counts: requests aborted after their first token (a request in the queue at the
        # start may be a preempted one that had its first token). At most 0: nothing wasted.
        aborted = floor = None
        if w.first_tokens is not None:
            aborted = w.start.running + w.first_tokens - w.finished - w.end.running
            if aborted + w.start.maybe_preempted <= 0:
                none = Estimate(
                    0.0, 0.0, 0.0,
                    f"no request was aborted after its first token ({w.finished:g} finished, "
                    f"{w.first_tokens:g} first tokens; {w.ends})",
                )  # fmt: skip
                return cls.of(w.done_output, none, w.prompt, none, aborted)
            floor = max(aborted - w.end.maybe_preempted, 0.0)  # each: >= 1 prompt, 1 output token

        if w.start.tokens is None or w.end.tokens is None:
            return cls.unknown(w.start.unknown or w.end.unknown, aborted)
        lengths = _mean_lengths(w)
        if isinstance(lengths, str):
            return cls.unknown(lengths, aborted)
        if (mixed := _mixed_prompts(w)) is not None:
            return cls.unknown(mixed, aborted)
        token_change = w.end.tokens - w.start.tokens
        return cls._bounded_by_counters(w, token_change, *lengths, floor or 0.0, aborted)

    @classmethod
    def _bounded_by_counters(
        cls, w: _Window, token_change: float, mean_prompt: float, mean_output: float,
        floor: float, aborted: float | None,
    ) -> _Waste:  # fmt: skip
        """The wasted tokens: counter - finished - in-flight change, each with its error."""
        # In-flight prompt tokens: running x mean prompt; the gap to the mean prompt of the
        # requests that started in the window bounds how wrong that is for the change.
        prompt_change = w.change * mean_prompt
        prompt_error = w.preempted * mean_prompt
        started_prompt = w.started_prompt
        if started_prompt is not None:
            prompt_error += abs(w.change) * abs(started_prompt - mean_prompt)
        # In-flight tokens (prompt + generated) from the KV slots held. A shared prefix's
        # blocks hold one copy for all the running requests that share it, so the slots can
        # only undercount, by at most (running - 1) x a request's prefix hits at each end:
        # one-sided, so the change's midpoint moves by half the difference. Preempted requests
        # hold no KV at all.
        hits = w.hits_per_request
        hidden_start = max(w.start.running - 1.0, 0.0) * hits
        hidden_end = max(w.end.running - 1.0, 0.0) * hits
        token_change += (hidden_end - hidden_start) / 2
        token_error = (
            w.start.tokens_error + w.end.tokens_error + (hidden_start + hidden_end) / 2
            + w.preempted * (mean_prompt + mean_output)
        )  # fmt: skip
        counted = "" if aborted is None else f"; {aborted:g} aborted after a first token"
        basis = f"counter - finished - in-flight change; {w.ends}{counted}"
        prefill = _bounded(
            w.prompt - w.done_prompt - prompt_change, prompt_error, floor,
            f"prompt tokens of aborted requests ({basis})",
        )  # fmt: skip
        generation = _bounded(
            w.generated - w.done_output - (token_change - prompt_change),
            token_error + prompt_error, floor,
            f"output tokens of aborted requests ({basis})",
        )  # fmt: skip
        return cls.of(w.done_output, generation, w.prompt, prefill, aborted)


def _mean_lengths(w: _Window) -> tuple[float, float] | str:
    """The mean prompt and output of the window's requests, to size what is in flight; or why
    nothing in the window gives them while the requests in flight changed."""
    mean_prompt = w.done_prompt / w.finished if w.finished else None
    mean_output = w.done_output / w.finished if w.finished else None
    if mean_prompt is None:
        mean_prompt = w.started_prompt
    preempted = w.preempted
    if ((w.change or preempted) and mean_prompt is None) or (preempted and mean_output is None):
        return (
            "too short to tell: the requests in flight changed and no request finished in "
            f"the window to take their lengths from ({w.ends})"
        )
    return mean_prompt or 0.0, mean_output or 0.0


def _mixed_prompts(w: _Window) -> str | None:
    """Why the tokens in flight cannot be split into prompt and output, or None when they can.

    The running requests' mix can change while their number does not (a long prompt ends, a
    chat starts), and then running x mean prompt says nothing about the prompt tokens in
    flight. Where the window's prompts span more than MIX_RANGE x (those that finished, by
    histogram bucket, and the mean of those that started), in-flight prompt and output tokens
    cannot be told apart. Blind spot: a request in flight at the start and aborted in the
    window, of a length nothing else in the window had.
    """
    low_prompt, high_prompt = w.prompt_range
    started_prompt = w.started_prompt
    mixed = high_prompt > MIX_RANGE * max(low_prompt, 1.0)
    if high_prompt and started_prompt is not None:  # the started ones' mean: another mix
        mixed = mixed or not low_prompt <= started_prompt <= high_prompt
        low_prompt, high_prompt = (
            min(low_prompt, started_prompt),
            max(high_prompt, started_prompt),
        )
    if mixed and (w.start.running or w.end.running):
        return (
            "too short to tell: prompts of very different lengths ended in the window "
            f"({low_prompt:g} to {high_prompt:g} tokens), so the tokens of the requests in "
            f"flight cannot be split into prompt and output ({w.ends})"
        )
    return None


def _prompt_range(before: Exposition, after: Exposition) -> tuple[float, float]:
    """The shortest and longest prompt that finished in the window, to the resolution of
    vLLM's prompt-length buckets ((0, 0) when none did or the page has no buckets; the +Inf
    bucket reads as an infinite length)."""
    b0, b1 = before.buckets(PROMPT_LENGTHS[0]), after.buckets(PROMPT_LENGTHS[0])
    delta = {le: c - b0.get(le, 0.0) for le, c in b1.items()}
    below, lower, low, high = 0.0, 0.0, None, 0.0
    for edge in sorted(delta):
        if delta[edge] > below:  # some finished prompts fell in (lower, edge]
            low = lower if low is None else low
            high = edge
        below, lower = delta[edge], edge
    return (0.0, 0.0) if low is None else (low, high)


def _bounded(estimate: float, error: float, floor: float, basis: str) -> Estimate:
    """A token count: the estimate +- its error, and at least what the counts show (>= 0)."""
    low, high = max(estimate - error, floor, 0.0), estimate + error
    if low > high:
        return Estimate.unknown(
            f"inconsistent: {basis} reads {estimate:.0f} +- {error:.0f}, the counts show at "
            f"least {floor:.0f}"
        )
    return Estimate(
        min(max(estimate, low), high), low, high, f"{basis}: {estimate:.0f} +- {error:.0f}"
    )


def _good_share(finished: float, waste: Estimate, what: str) -> Estimate:
    """finished / (finished + waste) over the requests that ended, with its bounds."""
    if waste.value is None or waste.low is None or waste.high is None:
        return Estimate.unknown(waste.basis)
    if finished + waste.high <= 0:
        return Estimate.unknown("no request ended in the window")
    if finished <= 0:
        if waste.low > 0:
            return Estimate(0.0, 0.0, 0.0, f"every request that ended was aborted ({waste.basis})")
        return Estimate.unknown(f"too short to tell whether any request ended ({waste.basis})")
    value = finished / (finished + waste.value)
    low, high = finished / (finished + waste.high), finished / (finished + waste.low)
    basis = (
        f"{finished:.0f} {what} of finished requests against {waste.value:.0f} "
        f"({waste.low:.0f}..{waste.high:.0f}) {waste.basis}"
    )
    if high - low > MAX_RATIO_SPREAD:
        return Estimate.unknown(f"too short to tell: between {low:.0%} and {high:.0%}; {basis}")
    return Estimate(value, low, high, basis)


def _prefill_share(prefill: Estimate, prompt: float) -> Estimate:
    """Wasted prefill over all prompt tokens prefilled in the window (as the shipped alert)."""
    if prefill.value is None or prefill.low is None or prefill.high is None:
        return prefill
    if prompt <= 0:
        return Estimate.unknown("no prompt was prefilled in the window")
    low, high = prefill.low / prompt, prefill.high / prompt
    basis = f"of {prompt:.0f} prompt tokens prefilled in the window; {prefill.basis}"
    if high - low > MAX_RATIO_SPREAD:
        return Estimate.unknown(f"too short to tell: between {low:.0%} and {high:.0%} {basis}")
    return Estimate(prefill.value / prompt, low, high, basis)


class MetricsScraper:
    """Scrapes one /metrics URL; the HTTP client and the clock are injected (tests, sampling)."""

    def __init__(
        self,
        url: str,
        *,
        client: httpx.AsyncClient,
        clock: Callable[[], float] = time.monotonic,
        require_vllm: bool = True,
    ) -> None:
        self.url = url
        self._client = client
        self._clock = clock
        self._require_vllm = require_vllm

    async def __call__(self, *, only: frozenset[str] | None = WINDOW_METRICS) -> Exposition:
        """Fetch and parse the page once, keeping the metrics in ``only`` (None: all)."""
        try:
            try:
                response = await self._client.get(self.url)
            except httpx.RemoteProtocolError:
                # A pooled connection the server closed (keep-alive timeout) just as it was
                # reused; a scrape is idempotent, so ask once more on a new connection.
                response = await self._client.get(self.url)
        except httpx.HTTPError as exc:
            raise EndpointError(redact(f"cannot scrape {self.url}: {exc}")) from exc
        if response.status_code != 200:
            raise ProbeError(
                redact(f"{self.url} answered HTTP {response.status_code}, not a metrics page")
            )
        return parse_page(
            response.text,
            url=redact(self.url),  # names it in messages only
            at=self._clock(),
            require_vllm=self._require_vllm,
            only=only,
        )


def parse_page(
    text: str,
    *,
    url: str,
    at: float,
    require_vllm: bool = True,
    only: frozenset[str] | None = None,
) -> Exposition:
    """Parse a scraped page, refusing one that is not a vLLM engine's when that is required."""
    try:
        page = Exposition.parse(text, at=at, only=only)
    except ProbeError as exc:
        raise ProbeError(redact(f"{url} is not a Prometheus metrics page: {exc}")) from exc
    if require_vllm and not is_vllm(page):
        raise ProbeError(
            redact(
                f"{url} is a metrics page but not a vLLM engine's (no "
                "vllm:generation_tokens_total); point --metrics-url at the engine itself, not "
                "at a gateway or exporter"
            )
        )
    return page
