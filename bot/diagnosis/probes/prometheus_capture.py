"""Capture a workload shape from Prometheus: an engine's history over a past window.

The same shape ``workload_capture`` makes from two scrapes of an engine's /metrics, made from
what Prometheus kept of that page: the window's growth is PromQL's ``increase()`` over
``[<window>s]``, evaluated at the window's end, and the result goes through the same builder
(``workload_capture.shape_from_window``). The queries, each summed over the engines the
selector matches (data parallel, replicas behind one label):

- lengths: ``sum by (le) (increase(vllm:request_prompt_tokens_bucket{SEL}[W]))`` and the
  same for ``vllm:request_generation_tokens``, with ``increase()`` of their ``_sum``;
- prefix-cache hit rate: ``increase()`` of ``vllm:prefix_cache_hits_total`` over that of
  ``vllm:prefix_cache_queries_total`` (older names, and the older hit-rate gauge averaged,
  when those are what Prometheus holds);
- mean concurrency: ``sum(avg_over_time(vllm:num_requests_running{SEL}[W]))``;
- api: ``increase(http_requests_total{SEL,method="POST"})`` by handler (90 % rule as for pages).

The shape's rate is the selected engines' summed (``arrivals.per`` ``fleet``; one replica's is
its own, ``replica``) over the replicas
Prometheus holds series of in the window (``arrivals.replicas``: distinct ``instance`` labels of
the prompt-length histogram, a replaced pod's new address counting as one more), so a diff
against a shape read over another number of replicas compares rates per replica.

What differs from a capture of pages: ``increase()`` handles counter resets, so a window
across an engine restart is read, not refused; and it extrapolates to the window's edges from
the first and last samples inside it, so counts are estimates to within a scrape interval's
share of the window (a shape's ``count`` is rounded). A selector that matches no vLLM series
in the window is refused (exit 2) naming the selector and the engines Prometheus does hold.

A target is named by a selector as Prometheus labels it: ``{instance="10.0.0.5:8000"}``
(a configured target's ``vllm_url`` host:port, the label the ``prometheus`` probe's
``$instance`` fills in), or any matchers: ``{job="vllm",namespace="inference"}``.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

import httpx

from bot.adr.workload import WorkloadShape
from bot.diagnosis.probes.vllm_metrics import PREFIX_HIT_RATE, PREFIX_HITS, PREFIX_QUERIES, RUNNING
from bot.diagnosis.probes.workload_capture import (
    API_HANDLERS,
    HTTP_REQUESTS,
    OUTPUT_LENGTHS,
    PROMPT_LENGTHS,
    Histogram,
    Window,
    shape_from_window,
)
from bot.kernel import EndpointError, ProbeError, UsageError
from bot.kernel.runtime.redact import redact

DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
MIN_WINDOW_S = 60.0  # increase() needs two samples in the window: a scrape interval or more
ENGINES_SHOWN = 5  # engines named when a selector matches none


def parse_since(text: str, *, minimum_s: float = MIN_WINDOW_S) -> float:
    """A window length: '1h', '30m', '90s', '2d', '1w', or plain seconds; UsageError if not."""
    match = DURATION.match(text)
    if match is None:
        raise UsageError(
            f"--since {text!r} is not a duration: write e.g. 1h, 30m, 600s (a plain number is "
            "seconds)"
        )
    seconds = float(match.group(1)) * UNITS[match.group(2) or "s"]
    if seconds < minimum_s or seconds <= 0:
        raise UsageError(
            f"--since {text!r} is shorter than {minimum_s:.0f} s: Prometheus needs two "
            "scrapes inside the window to say how a counter grew"
            if minimum_s
            else f"--since {text!r}: the window must be longer than 0 s"
        )
    return seconds


def parse_until(text: str | None, now: float) -> float:
    """The window's end as unix seconds: ISO 8601 with a time zone, unix seconds, or now."""
    if text is None:
        return now
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"--until {text!r} is not a time: write ISO 8601 with a zone "
            "(2026-09-01T12:00:00Z) or unix seconds"
        ) from None
    if when.tzinfo is None:
        raise UsageError(f"--until {text!r} has no time zone: add one (Z for UTC)")
    return when.timestamp()


def matchers(selector: str) -> str:
    """The matchers inside a selector's braces: '{job="vllm"}' -> 'job="vllm"'."""
    text = selector.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise UsageError(
            f"--selector {selector!r} must be label matchers in braces, as PromQL writes them: "
            '\'{instance="10.0.0.5:8000"}\' or \'{job="vllm",namespace="inference"}\''
        )
    return text[1:-1].strip().rstrip(",")


def instance_selector(hostport: str) -> str:
    """The selector of an engine at host:port, as Prometheus labels a scrape target."""
    return '{instance="' + hostport.replace("\\", "\\\\").replace('"', '\\"') + '"}'


class Prometheus:
    """Instant queries and series look-ups against one Prometheus, at one evaluation time."""

    def __init__(self, client: httpx.AsyncClient, base_url: str) -> None:
        self.client, self.base = client, base_url.rstrip("/")
        self.shown = redact(self.base)  # what messages and a shape's source name: no password

    async def _get(self, path: str, params: dict[str, Any]) -> Any:
        try:
            response = await self.client.get(f"{self.base}{path}", params=params)
        except httpx.HTTPError as exc:
            raise EndpointError(
                f"cannot reach Prometheus at {self.shown}: {redact(str(exc) or type(exc).__name__)}"
            ) from exc
        try:
            body: dict[str, Any] = response.json()
        except ValueError:
            raise ProbeError(
                f"{self.shown} answered HTTP {response.status_code} without JSON: is it a "
                "Prometheus (its HTTP API, /api/v1)?"
            ) from None
        if body.get("status") != "success":
            raise ProbeError(
                f"Prometheus at {self.shown} refused {params.get('query') or params}: "
                f"{body.get('error', response.status_code)}"
            )
        return body.get("data")

    async def vector(self, query: str, at: float) -> list[tuple[dict[str, str], float]]:
        """An instant query's vector: (labels, value) per series, NaN values left out."""
        data = await self._get("/api/v1/query", {"query": query, "time": at})
        if not isinstance(data, dict) or data.get("resultType") != "vector":
            raise ProbeError(f"Prometheus at {self.shown} answered {query!r} with no vector")
        out = []
        for row in data.get("result", []):
            value = float(row["value"][1])
            if not math.isnan(value):
                out.append((dict(row.get("metric", {})), value))
        return out

    async def scalar(self, query: str, at: float) -> float | None:
        """The one value of a summed query; None when no series answered."""
        rows = await self.vector(query, at)
        return math.fsum(v for _, v in rows) if rows else None

    async def series(self, match: str, start: float, end: float) -> list[dict[str, str]]:
        """Label sets of the series matching ``match`` between ``start`` and ``end``."""
        data = await self._get("/api/v1/series", {"match[]": match, "start": start, "end": end})
        return [dict(row) for row in data or []]


async def capture_from_prometheus(
    client: httpx.AsyncClient,
    base_url: str,
    *,
    selector: str,
    seconds: float,
    end: float,
) -> WorkloadShape:
    """The shape of the requests the selected engines finished in ``(end - seconds, end]``."""
    prom = Prometheus(client, base_url)
    inner = matchers(selector)
    sel = "{" + inner + "}"
    rows = await _vllm_series(prom, inner, start=end - seconds, end=end)
    names = {row.get("__name__", "") for row in rows}
    where = f"{sel} in Prometheus {prom.shown}"
    for name in (PROMPT_LENGTHS, OUTPUT_LENGTHS):
        if f"{name}_bucket" not in names:
            raise ProbeError(
                f"{where} holds no {name} histogram: the request lengths a shape is made of "
                "(vLLM has exposed it since its V1 engine)"
            )
    q = _WindowQueries(prom, inner, f"[{seconds:.0f}s]", end, names)
    hits, queries, gauge = await q.prefix_cache()
    running = await q.running()
    posts = await q.posts()
    window = Window(
        seconds=seconds,
        prompt=await q.histogram(PROMPT_LENGTHS),
        output=await q.histogram(OUTPUT_LENGTHS),
        prefix_hits=hits,
        prefix_queries=queries,
        hit_rate_gauge=gauge,
        running=running,
        posts=posts,
        replicas=(replicas := replicas_in(rows)),
        per="fleet" if replicas > 1 else "replica",  # one replica's sum is its own rate
    )
    return shape_from_window(
        window,
        source=f"prometheus {prom.shown} {sel} over {seconds:.0f} s to {_iso(end)}",
        captured_at=datetime.fromtimestamp(end, UTC),
        where=where,
        longer="--since",
    )


async def _vllm_series(
    prom: Prometheus, inner: str, *, start: float, end: float
) -> list[dict[str, str]]:
    """The vLLM series the selected engines have in the window; a selector that matches none
    is refused, naming the engines Prometheus does hold."""
    rows = await prom.series(_with(inner, '__name__=~"vllm:.+"'), start, end)
    if not rows:
        sel = "{" + inner + "}"
        engines = await _engines(prom, start, end)
        raise ProbeError(
            f"Prometheus at {prom.shown} holds no vLLM series matching {sel} between "
            f"{_iso(start)} and {_iso(end)}: check the selector (labels as Prometheus writes "
            f'them, e.g. instance="host:port") and --since/--until. {engines}'
        )
    return rows


def replicas_in(rows: list[dict[str, str]]) -> int:
    """How many replicas the series are of: distinct ``instance`` labels of the prompt-length
    histogram's count (an engine's data-parallel ranks are one server, one instance); label
    sets without the engine rank where Prometheus keeps no instance."""
    count = f"{PROMPT_LENGTHS}_count"
    servers = {
        row.get("instance") or repr(sorted((k, v) for k, v in row.items() if k != "engine"))
        for row in rows
        if row.get("__name__") == count
    }
    return max(len(servers), 1)


class _WindowQueries:
    """The window's queries over the selected engines, each evaluated at the window's end."""

    def __init__(self, prom: Prometheus, inner: str, w: str, end: float, names: set[str]) -> None:
        self.prom, self.inner, self.sel = prom, inner, "{" + inner + "}"
        self.w, self.end, self.names = w, end, names

    async def histogram(self, name: str) -> Histogram:
        """A length histogram's growth in the window, summed over engines by bucket edge."""
        sel, w = self.sel, self.w
        rows = await self.prom.vector(f"sum by (le) (increase({name}_bucket{sel}{w}))", self.end)
        cumulative: dict[float, float] = {}
        for labels, value in rows:  # engines may write one edge two ways: le="100", "100.0"
            edge = float(labels.get("le", "nan"))
            if not math.isnan(edge):
                cumulative[edge] = cumulative.get(edge, 0.0) + value
        cumulative = dict(sorted(cumulative.items()))
        total = await self.prom.scalar(f"sum(increase({name}_sum{sel}{w}))", self.end)
        return Histogram(cumulative, total)

    async def increase(self, candidates: tuple[str, ...]) -> float | None:
        """A counter's growth in the window under the first of its names Prometheus holds."""
        name = next((n for n in candidates if n in self.names), None)
        if name is None:
            return None
        return await self.prom.scalar(f"sum(increase({name}{self.sel}{self.w}))", self.end)

    async def prefix_cache(self) -> tuple[float | None, float | None, float | None]:
        """Prefix-cache hits and queries in the window, or else the older hit-rate gauge."""
        hits, queries = await self.increase(PREFIX_HITS), await self.increase(PREFIX_QUERIES)
        if hits is None or queries is None:
            hits = queries = None
        gauge = None
        if hits is None and PREFIX_HIT_RATE[0] in self.names:
            gauge = await self.prom.scalar(
                f"avg(avg_over_time({PREFIX_HIT_RATE[0]}{self.sel}{self.w}))", self.end
            )
        return hits, queries, gauge

    async def running(self) -> float | None:
        """The mean number of requests running over the window, summed over engines."""
        if RUNNING[0] not in self.names:
            return None
        query = f"sum(avg_over_time({RUNNING[0]}{self.sel}{self.w}))"
        return await self.prom.scalar(query, self.end)

    async def posts(self) -> dict[str, float]:
        """POST requests in the window by API (the handlers ``API_HANDLERS`` knows)."""
        posts = dict.fromkeys(API_HANDLERS.values(), 0.0)
        post = _with(self.inner, 'method="POST"')
        rows = await self.prom.vector(
            f"sum by (handler) (increase({HTTP_REQUESTS}{post}{self.w}))", self.end
        )
        for labels, value in rows:
            api = API_HANDLERS.get(labels.get("handler", ""))
            if api is not None:
                posts[api] += max(value, 0.0)
        return posts


def _with(inner: str, matcher: str) -> str:
    """A selector of ``inner``'s matchers and one more."""
    return "{" + ",".join(part for part in (matcher, inner) if part) + "}"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


async def _engines(prom: Prometheus, start: float, end: float) -> str:
    """A sentence naming the vLLM engines Prometheus does hold in the window (a few)."""
    rows = await prom.series("{" + f'__name__="{RUNNING[0]}"' + "}", start, end)
    shown = []
    for row in rows[:ENGINES_SHOWN]:
        labels = {k: v for k, v in sorted(row.items()) if k in ("instance", "job", "namespace",
                                                                  "pod", "model_name")}  # fmt: skip
        shown.append("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}")
    if not shown:
        return "It holds no vllm:num_requests_running series at all in that window."
    more = f" and {len(rows) - ENGINES_SHOWN} more" if len(rows) > ENGINES_SHOWN else ""
    return f"Engines it holds: {', '.join(shown)}{more}."
