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
restart (its counters fall) that the pages cannot tell apart. Scraping is ``bot/diagnosis/probes``'
(``MetricsScraper``); this module only turns pages into a shape.

A target of several replicas is read as the diagnosis window reads it (``capture_fleet``,
``bot/diagnosis/probes/fleet_window.py``): every replica scraped in the same rounds, deltas taken
within each engine process and summed; a replica that restarted or stopped answering is named in the
shape's source, never read as zero. Such a shape's rate is the fleet's (``arrivals.per`` ``fleet``,
over ``arrivals.replicas``); one engine's is per replica.

One builder for every source: pages become a ``Window`` (the counts' growth over the window),
and ``shape_from_window`` makes the shape of it. Prometheus's history
(``prometheus_capture.py``) and the gateway's request records (``gateway_capture.py``) make
their own ``Window`` and go through the same builder, so the arithmetic (shares, quantiles,
hit rate, rate, the API's majority) is written once.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from bot.adr.workload import (
    Arrivals,
    Lengths,
    Prefix,
    PrefixGroup,
    RatePer,
    WorkloadShape,
    new_shape,
)
from bot.diagnosis.probes import vllm_metrics
from bot.diagnosis.probes.engine_identity import IDENTITY_METRICS
from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.fleet_window import FleetWindow, sample_fleet
from bot.diagnosis.probes.replicas import Replica
from bot.diagnosis.probes.vllm_metrics import (
    GENERATION_TOKENS,
    PREFIX_HIT_RATE,
    PREFIX_HITS,
    PREFIX_QUERIES,
    RUNNING,
    counter_delta,
    gauge,
)
from bot.kernel import ProbeError, UsageError
from bot.kernel.runtime.redact import redact

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
        *PREFIX_HIT_RATE, *GENERATION_TOKENS, *IDENTITY_METRICS,
    }
)  # fmt: skip

Scrape = Callable[[], Awaitable[Exposition]]
ReplicaScrape = Callable[[Replica], Awaitable[Exposition]]


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
    """One engine's /metrics at ``url``: scrape every ``interval_s`` for ``seconds`` (the
    scrapes' own clock) and return the shape of what finished between the first and last."""
    return await capture_fleet(
        [Replica(url.removesuffix("/metrics"))],
        lambda _: scrape(),
        seconds=seconds,
        interval_s=interval_s,
        on_progress=on_progress,
        sleep=sleep,
        now=now,
    )


async def capture_fleet(
    replicas: Sequence[Replica],
    scrape: ReplicaScrape,
    *,
    seconds: float,
    interval_s: float = DEFAULT_INTERVAL_S,
    on_progress: Callable[[CaptureProgress], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> WorkloadShape:
    """Every replica's /metrics in the same rounds for ``seconds``: the shape of what the
    fleet finished (deltas within each engine process, summed; docs/fleet.md)."""
    if seconds <= 0 or interval_s <= 0:
        raise UsageError("a capture needs a window and an interval longer than 0 s")
    progress = _Progress(seconds, on_progress)
    fleet = await sample_fleet(
        replicas,
        progress.counting(scrape),
        seconds=seconds,
        interval_s=interval_s,
        sleep=progress.reporting(sleep),
        clock=clock,
    )
    progress.report()
    return shape_from_fleet(fleet, captured_at=now())


class _Progress:
    """Says where a capture stands after each round: the scrapes see each replica's count of
    finished requests, the sleeps between rounds mark a round's end."""

    def __init__(self, seconds: float, on_progress: Callable[[CaptureProgress], None] | None):
        self._seconds, self._on_progress = seconds, on_progress
        self._first: dict[Replica, Exposition] = {}
        self._last: dict[Replica, Exposition] = {}
        self._rounds = 0

    def counting(self, scrape: ReplicaScrape) -> ReplicaScrape:
        async def counted(replica: Replica) -> Exposition:
            page = await scrape(replica)
            self._first.setdefault(replica, page)
            self._last[replica] = page
            return page

        return counted

    def reporting(
        self, sleep: Callable[[float], Awaitable[None]]
    ) -> Callable[[float], Awaitable[None]]:
        async def slept(delay: float) -> None:
            self.report()
            await sleep(delay)

        return slept

    def report(self) -> None:
        """A round ended: say so (not after the first, which has nothing to say)."""
        self._rounds += 1
        if self._on_progress is None or self._rounds < 2 or not self._last:
            return
        first_at = min(page.at for page in self._first.values())
        last_at = max(page.at for page in self._last.values())
        finished = math.fsum(  # progress only: a restart's fall is not worth more than this
            max(_count(self._last[r], PROMPT_LENGTHS) - _count(page, PROMPT_LENGTHS), 0.0)
            for r, page in self._first.items()
        )
        self._on_progress(
            CaptureProgress(
                elapsed_s=last_at - first_at,
                seconds=self._seconds,
                scrapes=self._rounds,
                finished=int(round(finished)),
            )
        )


def shape_from_fleet(fleet: FleetWindow, *, captured_at: datetime) -> WorkloadShape:
    """The shape of a fleet window's merged pages; one engine's is per replica, several
    replicas' the fleet's, each replica that restarted or missed scrapes named in its source."""
    pages = fleet.window.pages
    counted = [r for r in fleet.replicas if r.answered >= 2]  # one page gives no delta
    if len(fleet.replicas) == 1 and not fleet.replicas[0].notes:
        return shape_from_pages(pages, url=fleet.replicas[0].replica.metrics_url,
                                captured_at=captured_at)  # fmt: skip
    if not counted:
        raise ProbeError(
            "no replica answered twice in the window: there is no delta to take ("
            + "; ".join(f"{r.replica.address} {', '.join(r.notes)}" for r in fleet.replicas)
            + ")"
        )
    where = f"{len(counted)} of {len(fleet.replicas)} replicas"
    per: RatePer = "fleet" if len(fleet.replicas) > 1 else "replica"
    window = replace(window_from_pages(pages, where=where), replicas=len(counted), per=per)
    said = [f"{r.replica.address} {note}" for r in fleet.replicas for note in r.notes]
    source = (
        f"metrics fleet of {where} over {window.seconds:.0f} s ({len(pages)} rounds)"
        + "".join(f"; {note}" for note in said)
    )
    return shape_from_window(
        window, source=redact(source), captured_at=captured_at, where=where, longer="--seconds"
    )


@dataclass(frozen=True)
class Histogram:
    """A length histogram's growth over a window: cumulative counts by upper edge, and its sum."""

    cumulative: Mapping[float, float]
    total: float | None  # the growth of its _sum: tokens in all; None when not known

    @property
    def count(self) -> float:
        """Observations in the window: the +Inf bucket's (the highest edge's) count."""
        return self.cumulative[max(self.cumulative)] if self.cumulative else 0.0


@dataclass(frozen=True)
class Window:
    """What one window of traffic counted, whichever source read it (an engine's /metrics
    pages, Prometheus's history of them, the gateway's request records): the one input of
    ``shape_from_window``, so every source's shape is made by the same arithmetic."""

    seconds: float
    prompt: Histogram
    output: Histogram
    prefix_hits: float | None = None  # tokens; hits and queries together, or neither
    prefix_queries: float | None = None
    hit_rate_gauge: float | None = None  # older engines' gauge, averaged (when no counters)
    running: float | None = None  # mean requests running
    posts: Mapping[str, float] = field(default_factory=dict)  # api -> POSTs in the window
    requests: float | None = None  # the rate's numerator; default: the prompt histogram's count
    groups: tuple[PrefixGroup, ...] = ()
    burstiness: float | None = None
    replicas: int = 1  # engine replicas the counts were read over
    per: RatePer = "replica"  # the rate one replica's, or summed over the fleet ("fleet")


def shape_from_window(
    window: Window, *, source: str, captured_at: datetime, where: str, longer: str
) -> WorkloadShape:
    """The shape of a window's counts. ``where`` names the source in errors (a URL, a
    selector); ``longer`` is the advice for an empty window (which flag makes it longer)."""
    finished = window.prompt.count
    if finished < 0.5:  # Prometheus's increase() estimates: half a request is none
        raise UsageError(
            f"no request finished in the {window.seconds:.0f} s window at {where}: there is no "
            f"shape to take; capture longer ({longer}) or while the engine serves traffic"
        )
    requests = finished if window.requests is None else window.requests
    return new_shape(
        source=source,
        captured_at=captured_at,
        api=api_of(window.posts),
        prompt_tokens=_lengths(window.prompt, PROMPT_LENGTHS, where),
        output_tokens=_lengths(window.output, OUTPUT_LENGTHS, where),
        prefix=Prefix(hit_rate=hit_rate(window), groups=window.groups),
        arrivals=Arrivals(
            request_rate=round(requests / window.seconds, 4),
            concurrency=None if window.running is None else round(window.running, 3),
            burstiness=window.burstiness,
            replicas=window.replicas,
            per=window.per,
        ),
    )


def shape_from_pages(
    pages: Sequence[Exposition], *, url: str, captured_at: datetime
) -> WorkloadShape:
    """The shape of the requests that finished between the first and the last page."""
    url = redact(url)  # named in messages and the shape's source only
    window = window_from_pages(pages, where=url)
    return shape_from_window(
        window,
        source=f"metrics {url} over {window.seconds:.0f} s ({len(pages)} scrapes)",
        captured_at=captured_at,
        where=url,
        longer="--seconds",
    )


def window_from_pages(pages: Sequence[Exposition], *, where: str) -> Window:
    """What grew between the first and the last page (``where`` names them in errors)."""
    if len(pages) < 2:
        raise UsageError("a capture needs two scrapes at least: the window's start and end")
    first, last = pages[0], pages[-1]
    seconds = last.at - first.at
    if seconds <= 0:
        raise UsageError("the scrapes are 0 s apart: capture over a window (--seconds)")
    for name in (PROMPT_LENGTHS, OUTPUT_LENGTHS):
        if not all(page.has(f"{name}_count") for page in pages):
            raise ProbeError(
                f"{where} exposes no {name} histogram: the request lengths a shape is made of "
                "(vLLM has exposed it since its V1 engine; is this a vLLM engine's /metrics?)"
            )
    _refuse_restart(pages, where)
    rates = [r for page in pages if (r := gauge(page, PREFIX_HIT_RATE)) is not None]
    running = [v for page in pages if (v := gauge(page, RUNNING)) is not None]
    return Window(
        seconds=seconds,
        prompt=_growth(first, last, PROMPT_LENGTHS, where),
        output=_growth(first, last, OUTPUT_LENGTHS, where),
        prefix_hits=counter_delta(first, last, PREFIX_HITS),
        prefix_queries=counter_delta(first, last, PREFIX_QUERIES),
        hit_rate_gauge=math.fsum(rates) / len(rates) if rates else None,
        running=math.fsum(running) / len(running) if running else None,
        posts=_posts(first, last),
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


def _growth(first: Exposition, last: Exposition, histogram: str, url: str) -> Histogram:
    """A histogram's growth between two pages."""
    b0, b1 = first.buckets(histogram), last.buckets(histogram)
    delta = {edge: count - b0.get(edge, 0.0) for edge, count in b1.items()}
    grew = (last.total(f"{histogram}_sum") or 0.0) - (first.total(f"{histogram}_sum") or 0.0)
    return Histogram(delta, grew if grew >= 0 else None)


def _lengths(histogram: Histogram, name: str, where: str) -> Lengths:
    """The histogram's growth over the window, as shares of its requests."""
    delta = histogram.cumulative
    if not delta or any(value < 0 for value in delta.values()):
        raise ProbeError(f"{where}: the buckets of {name} do not add up over the window")
    if histogram.count <= 0:
        raise ProbeError(f"{where}: {name} counted no request in the window")
    total = histogram.total if histogram.total is None or histogram.total >= 0 else None
    return Lengths.from_cumulative(delta, total=total)


def hit_rate(window: Window) -> float | None:
    """Prefix-cache hits over queries in the window; older engines' gauge; else None."""
    hits, queries = window.prefix_hits, window.prefix_queries
    if hits is not None and queries is not None:
        return round(min(hits / queries, 1.0), 4) if queries > 0 else None
    if window.hit_rate_gauge is not None:
        return round(min(window.hit_rate_gauge, 1.0), 4)
    return None


def _posts(first: Exposition, last: Exposition) -> dict[str, float]:
    """The window's POSTs per API, by the engine's HTTP counter."""
    posts = {}
    for handler, api in API_HANDLERS.items():
        where = {"handler": handler, "method": "POST"}
        was, now = first.total(HTTP_REQUESTS, where=where), last.total(HTTP_REQUESTS, where=where)
        posts[api] = max((now or 0.0) - (was or 0.0), 0.0)
    return posts


def api_of(posts: Mapping[str, float]) -> str:
    """The API that got at least ``API_MAJORITY`` of the window's POSTs, else 'unknown'."""
    total = math.fsum(posts.values())
    if total <= 0:
        return "unknown"
    api, most = max(posts.items(), key=lambda item: item[1])
    return api if most / total >= API_MAJORITY else "unknown"
