"""Capture a workload shape from an engine's own /metrics: scrapes N seconds apart, as deltas.

vLLM records each request's prompt and output length in two histograms when the request
finishes (``vllm:request_prompt_tokens``, ``vllm:request_generation_tokens``; an aborted request
is never recorded). Between the first and the last scrape of a window their buckets grew by the
requests that finished in it: those deltas are the shape's length distributions, the engine's
bucket edges kept. Beside them:

- request rate: requests finished in the window (the prompt histogram's count) per second;
- mean concurrency: ``vllm:num_requests_running`` averaged over every scrape of the window;
- prefix-cache hit rate: Δ``prefix_cache_hits`` / Δ``prefix_cache_queries`` (tokens). That is
  all /metrics say about prefixes: which requests shared which prefix is not exposed, so a
  captured shape declares no groups;
- api: the API the engine's own HTTP counter (``http_requests_total`` by handler) saw at least
  90 % of the window's POSTs on; ``unknown`` when it is not exposed or traffic was mixed;
- burstiness: unknown (None): per-request arrival times are not on /metrics.

A window in which no request finished has no shape and is refused, as is one across an engine
restart (its counters fall). Scraping is ``bot/probes``' (``MetricsScraper``); this module only
turns pages into a shape.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from bot.errors import ProbeError, UsageError
from bot.probes import vllm_metrics
from bot.probes.exposition import Exposition
from bot.probes.vllm_metrics import (
    GENERATION_TOKENS,
    PREFIX_HIT_RATE,
    PREFIX_HITS,
    PREFIX_QUERIES,
    RUNNING,
    counter_delta,
    gauge,
)
from bot.workload.shape import Arrivals, Lengths, Prefix, WorkloadShape, new_shape

PROMPT_LENGTHS = vllm_metrics.PROMPT_LENGTHS[0]  # the engine's per-request length histograms
OUTPUT_LENGTHS = vllm_metrics.OUTPUT_LENGTHS[0]
HTTP_REQUESTS = "http_requests_total"  # vLLM's API server: by handler, method and status
API_HANDLERS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
API_MAJORITY = 0.9  # the share of the window's POSTs one API needs to name the shape's api
DEFAULT_INTERVAL_S = 2.0  # between scrapes: each makes the engine render its page
# What a capture reads: scrapes parse only these.
CAPTURE_METRICS = frozenset(
    {
        PROMPT_LENGTHS, OUTPUT_LENGTHS, HTTP_REQUESTS, *RUNNING, *PREFIX_QUERIES, *PREFIX_HITS,
        *PREFIX_HIT_RATE, *GENERATION_TOKENS,
    }
)  # fmt: skip

Scrape = Callable[[], Awaitable[Exposition]]


@dataclass(frozen=True)
class CaptureProgress:
    """Where a capture stands after a scrape."""

    elapsed_s: float
    seconds: float  # the window asked for
    scrapes: int
    finished: int  # requests finished since the first scrape


async def capture(
    scrape: Scrape,
    *,
    url: str,
    seconds: float,
    interval_s: float = DEFAULT_INTERVAL_S,
    on_progress: Callable[[CaptureProgress], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> WorkloadShape:
    """Scrape every ``interval_s`` for ``seconds`` (the scrapes' own clock) and return the shape
    of what finished between the first scrape and the last."""
    if seconds <= 0 or interval_s <= 0:
        raise UsageError("a capture needs a window and an interval longer than 0 s")
    pages = [await scrape()]
    first = pages[0]
    while (elapsed := pages[-1].at - first.at) < seconds:
        await sleep(min(interval_s, seconds - elapsed))
        pages.append(await scrape())
        if on_progress is not None:
            on_progress(
                CaptureProgress(
                    elapsed_s=pages[-1].at - first.at,
                    seconds=seconds,
                    scrapes=len(pages),
                    finished=int(
                        round(_count(pages[-1], PROMPT_LENGTHS) - _count(first, PROMPT_LENGTHS))
                    ),
                )
            )
    return shape_from_pages(pages, url=url, captured_at=now())


def shape_from_pages(
    pages: Sequence[Exposition], *, url: str, captured_at: datetime
) -> WorkloadShape:
    """The shape of the requests that finished between the first and the last page."""
    if len(pages) < 2:
        raise UsageError("a capture needs two scrapes at least: the window's start and end")
    first, last = pages[0], pages[-1]
    window = last.at - first.at
    if window <= 0:
        raise UsageError("the scrapes are 0 s apart: capture over a window (--seconds)")
    for name in (PROMPT_LENGTHS, OUTPUT_LENGTHS):
        if not all(page.has(f"{name}_count") for page in pages):
            raise ProbeError(
                f"{url} exposes no {name} histogram: the request lengths a shape is made of "
                "(vLLM has exposed it since its V1 engine; is this a vLLM engine's /metrics?)"
            )
    _refuse_restart(pages, url)
    finished = _count(last, PROMPT_LENGTHS) - _count(first, PROMPT_LENGTHS)
    if finished <= 0:
        raise UsageError(
            f"no request finished in the {window:.0f} s window at {url}: there is no shape to "
            "take; capture longer (--seconds) or while the engine serves traffic"
        )
    return new_shape(
        source=f"metrics {url} over {window:.0f} s ({len(pages)} scrapes)",
        captured_at=captured_at,
        api=_api(first, last),
        prompt_tokens=_lengths(first, last, PROMPT_LENGTHS, url),
        output_tokens=_lengths(first, last, OUTPUT_LENGTHS, url),
        prefix=Prefix(hit_rate=_hit_rate(pages)),
        arrivals=Arrivals(
            request_rate=round(finished / window, 4), concurrency=_mean_running(pages)
        ),
    )


def _count(page: Exposition, histogram: str) -> float:
    return page.total(f"{histogram}_count") or 0.0


def _refuse_restart(pages: Sequence[Exposition], url: str) -> None:
    """A counter that falls between two scrapes: the engine restarted, the window is broken."""
    for number, (before, after) in enumerate(zip(pages, pages[1:], strict=False), 2):
        for name in (PROMPT_LENGTHS, OUTPUT_LENGTHS):
            was, now = _count(before, name), _count(after, name)
            if now < was:
                raise ProbeError(
                    f"{url}: {name}_count fell from {was:g} to {now:g} at scrape {number}: the "
                    "engine restarted during the capture; capture again"
                )


def _lengths(first: Exposition, last: Exposition, histogram: str, url: str) -> Lengths:
    """The histogram's growth over the window, as shares of its requests."""
    b0, b1 = first.buckets(histogram), last.buckets(histogram)
    delta = {edge: count - b0.get(edge, 0.0) for edge, count in b1.items()}
    if not delta or any(value < 0 for value in delta.values()):
        raise ProbeError(f"{url}: the buckets of {histogram} do not add up between the scrapes")
    if delta[max(delta)] <= 0:
        raise ProbeError(f"{url}: {histogram} counted no request in the window")
    grew = (last.total(f"{histogram}_sum") or 0.0) - (first.total(f"{histogram}_sum") or 0.0)
    return Lengths.from_cumulative(delta, total=grew if grew >= 0 else None)


def _hit_rate(pages: Sequence[Exposition]) -> float | None:
    """Prefix-cache hits over queries in the window; older engines' gauge averaged; else None."""
    first, last = pages[0], pages[-1]
    hits = counter_delta(first, last, PREFIX_HITS)
    queries = counter_delta(first, last, PREFIX_QUERIES)
    if hits is not None and queries is not None:
        return round(min(hits / queries, 1.0), 4) if queries > 0 else None
    rates = [r for page in pages if (r := gauge(page, PREFIX_HIT_RATE)) is not None]
    return round(min(math.fsum(rates) / len(rates), 1.0), 4) if rates else None


def _mean_running(pages: Sequence[Exposition]) -> float | None:
    """The running-requests gauge averaged over the scrapes; None when not exposed."""
    values = [v for page in pages if (v := gauge(page, RUNNING)) is not None]
    return round(math.fsum(values) / len(values), 3) if values else None


def _api(first: Exposition, last: Exposition) -> str:
    """The API nearly all of the window's POSTs used, by the engine's HTTP counter."""
    posts = {}
    for handler, api in API_HANDLERS.items():
        where = {"handler": handler, "method": "POST"}
        was, now = first.total(HTTP_REQUESTS, where=where), last.total(HTTP_REQUESTS, where=where)
        posts[api] = max((now or 0.0) - (was or 0.0), 0.0)
    total = math.fsum(posts.values())
    if total <= 0:
        return "unknown"
    api, most = max(posts.items(), key=lambda item: item[1])
    return api if most / total >= API_MAJORITY else "unknown"
