"""The vLLM metrics probe: scrape /metrics, and read an engine window from two scrapes.

Metric names moved across vLLM versions; each reading lists its names newest first and takes
the first one the page exposes. Counters and histograms are read as deltas between two
scrapes, so a window says what happened between them, not since the engine started.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import httpx

from bot.errors import EndpointError, ProbeError
from bot.probes.exposition import Exposition, histogram_quantile

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
PREFIX_HIT_RATE = ("vllm:gpu_prefix_cache_hit_rate",)  # older engines: a gauge, not counters
GENERATION_TOKENS = ("vllm:generation_tokens_total",)
PROMPT_TOKENS = ("vllm:prompt_tokens_total",)
REQUEST_PROMPT_TOKENS_SUM = ("vllm:request_prompt_tokens_sum",)
REQUEST_GENERATION_TOKENS_SUM = ("vllm:request_generation_tokens_sum",)
REQUEST_SUCCESS = ("vllm:request_success_total",)
CACHE_CONFIG = ("vllm:cache_config_info",)

# What a window needs, and what an in-flight sample needs: scrapes parse only these.
WINDOW_METRICS = frozenset(
    name
    for names in (
        TTFT, ITL, QUEUE_TIME, E2E, RUNNING, WAITING, KV_USAGE, PREEMPTIONS, PREFIX_QUERIES,
        PREFIX_HITS, PREFIX_HIT_RATE, GENERATION_TOKENS, PROMPT_TOKENS, REQUEST_PROMPT_TOKENS_SUM,
        REQUEST_GENERATION_TOKENS_SUM, REQUEST_SUCCESS, CACHE_CONFIG,
    )
    for name in names
)  # fmt: skip
SAMPLE_METRICS = frozenset((*RUNNING, *WAITING, *KV_USAGE, *GENERATION_TOKENS))


@dataclass(frozen=True)
class Quantiles:
    """Latency quantiles in milliseconds (None where there was no observation)."""

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None
    count: int

    @classmethod
    def from_histogram(
        cls, before: Exposition, after: Exposition, names: Sequence[str]
    ) -> Quantiles:
        """Quantiles of the observations a histogram gained between two scrapes."""
        name = after.first_present(f"{n}_bucket" for n in names)
        if name is None:
            return cls(None, None, None, None, 0)
        base = name.removesuffix("_bucket")
        b1, b0 = after.buckets(base), before.buckets(base)
        delta = {le: c - b0.get(le, 0.0) for le, c in b1.items()}
        count = (after.total(f"{base}_count") or 0.0) - (before.total(f"{base}_count") or 0.0)
        total = (after.total(f"{base}_sum") or 0.0) - (before.total(f"{base}_sum") or 0.0)

        def ms(q: float) -> float | None:
            value = histogram_quantile(q, delta)
            return None if value is None else value * 1000.0

        return cls(
            p50=ms(0.5),
            p90=ms(0.9),
            p99=ms(0.99),
            mean=total / count * 1000.0 if count > 0 else None,
            count=int(round(count)),
        )


@dataclass(frozen=True)
class CacheConfig:
    """KV-cache geometry from vllm:cache_config_info."""

    block_size: int
    num_gpu_blocks: int


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
    prompt_tokens_per_s: float | None
    finished_generation_tokens: float | None
    goodput_ratio: float | None
    wasted_prefill_tokens: float | None
    requests_finished: float | None
    cache: CacheConfig | None

    def as_dict(self) -> dict[str, object]:
        """Plain dict for JSON reports."""
        return asdict(self)


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
    """A gauge summed over label sets (e.g. over engines), None when not exposed."""
    name = page.first_present(names)
    return None if name is None else page.total(name)


def counter_delta(before: Exposition, after: Exposition, names: Sequence[str]) -> float | None:
    """How much a counter grew between two scrapes; None if either scrape lacks it."""
    name = after.first_present(names)
    if name is None or not before.has(name):
        return None
    v1, v0 = after.total(name), before.total(name)
    assert v1 is not None and v0 is not None
    return max(v1 - v0, 0.0)  # a restart resets counters: never report negative work


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def read_window(before: Exposition, after: Exposition) -> EngineWindow:
    """The engine-side view of the window between two scrapes of the same engine."""
    duration = max(after.at - before.at, 1e-9)
    generated = counter_delta(before, after, GENERATION_TOKENS)
    prompt = counter_delta(before, after, PROMPT_TOKENS)
    finished_prompt = counter_delta(before, after, REQUEST_PROMPT_TOKENS_SUM)
    finished_generated = counter_delta(before, after, REQUEST_GENERATION_TOKENS_SUM)
    preemptions = counter_delta(before, after, PREEMPTIONS)
    hits = counter_delta(before, after, PREFIX_HITS)
    queries = counter_delta(before, after, PREFIX_QUERIES)
    hit_rate = _ratio(hits, queries)
    if hit_rate is None and queries is None:
        hit_rate = gauge(after, PREFIX_HIT_RATE)
    wasted = None
    if prompt is not None and finished_prompt is not None:
        wasted = max(prompt - finished_prompt, 0.0)
    goodput = _ratio(finished_generated, generated)
    return EngineWindow(
        duration_s=duration,
        ttft_ms=Quantiles.from_histogram(before, after, TTFT),
        itl_ms=Quantiles.from_histogram(before, after, ITL),
        queue_time_ms=Quantiles.from_histogram(before, after, QUEUE_TIME),
        e2e_ms=Quantiles.from_histogram(before, after, E2E),
        requests_running=gauge(after, RUNNING),
        requests_waiting=gauge(after, WAITING),
        kv_cache_usage=gauge(after, KV_USAGE),
        preemptions_per_s=None if preemptions is None else preemptions / duration,
        prefix_cache_hit_rate=hit_rate,
        generation_tokens=generated,
        prompt_tokens=prompt,
        generation_tokens_per_s=None if generated is None else generated / duration,
        prompt_tokens_per_s=None if prompt is None else prompt / duration,
        finished_generation_tokens=finished_generated,
        goodput_ratio=None if goodput is None else min(goodput, 1.0),
        wasted_prefill_tokens=wasted,
        requests_finished=counter_delta(before, after, REQUEST_SUCCESS),
        cache=cache_config(after),
    )


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
            raise EndpointError(f"cannot scrape {self.url}: {exc}") from exc
        if response.status_code != 200:
            raise ProbeError(f"{self.url} answered HTTP {response.status_code}, not a metrics page")
        return parse_page(
            response.text,
            url=self.url,
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
        raise ProbeError(f"{url} is not a Prometheus metrics page: {exc}") from exc
    if require_vllm and not is_vllm(page):
        raise ProbeError(
            f"{url} is a metrics page but not a vLLM engine's (no vllm:generation_tokens_total); "
            "point --metrics-url at the engine itself, not at a gateway or exporter"
        )
    return page
