"""Capture a workload shape from the gateway's request records (``GET /admin/requests``).

The gateway keeps one record per admitted request (``bot/gateway/records.py``: arrival,
lengths, outcome, prefix hashes; never content). This module turns an export of them into the
same shape a capture of /metrics makes, through the same builder
(``workload_capture.shape_from_window``), and adds what only per-request records can say:

- **lengths**: the prompt and output tokens of the requests that ended ``ok`` (vLLM's
  histograms count finished requests too), binned on vLLM's own bucket edges (1, 2, 5, 10,
  20, 50, ... per decade, to the first edge at or above the longest length and at least
  10,000, then +Inf), so a gateway shape diffs edge by edge with one from /metrics;
- **request_rate**: arrivals per second over the records (every outcome: the traffic
  offered to the engine), ``(n - 1) / (last arrival - first arrival)``, one over the mean gap;
- **burstiness**: the gamma shape of the gaps between arrivals by the method of moments,
  ``mean(gaps)² / variance(gaps)``: 1 for Poisson arrivals, below 1 burstier, above 1 more
  even, as ``vllm bench serve --burstiness`` takes it. Needs ``MIN_GAPS`` gaps; evenly spaced
  arrivals (no variance) read as ``MAX_BURSTINESS``;
- **concurrency**: requests in flight at the gateway, by Little's law: the sum of the
  records' durations over the span from the first arrival to the last end. That is running
  *and* waiting in the engine (vLLM's ``num_requests_running`` is running only);
- **prefix.groups**: requests that share a prefix hash. Each request joins the group of its
  deepest hashed level that at least one other request shares (levels double: 64, 128, ...,
  32,768 tokens), so the groups partition the requests; a group's ``length`` is that level
  (a lower bound of the shared prefix, within 2x of it) and its ``share`` its part of all
  records. Text prompts are hashed in 4-character blocks' levels: their length converts to
  tokens by the group's own tokens per character (``prompt_tokens / prompt_chars``). Only
  groups of ``MIN_GROUP_REQUESTS`` or more and ``MIN_GROUP_SHARE`` of the requests are kept,
  the ``MAX_GROUPS`` largest;
- **hit_rate**: not known here (the engine's cache is not the gateway's); ``null``;
- **api**: the API of at least 90 % of the records, as for /metrics.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from bot.adr.workload import PrefixGroup, WorkloadShape
from bot.diagnosis.probes.workload_capture import Histogram, Window, shape_from_window
from bot.kernel import EndpointError, ProbeError, UsageError
from bot.kernel.runtime.redact import redact

TOKEN_ENV = "RULELOOP_GATEWAY_ADMIN_TOKEN"  # the gateway's own admin token variable
EXPORT_VERSION = 1  # of the gateway's /admin/requests export
EXPORT_PATH = "/admin/requests"
MIN_GAPS = 10  # arrivals gaps needed to estimate burstiness
MAX_BURSTINESS = 100.0  # evenly spaced arrivals: "very even", not infinity
MIN_GROUP_REQUESTS = 2
MIN_GROUP_SHARE = 0.01
MAX_GROUPS = 16
LEAST_LAST_EDGE = 10_000  # vLLM's edges for a 16k-context model end here


@dataclass(frozen=True)
class Request:
    """One gateway record, as the converter reads it."""

    at: float
    api: str
    outcome: str
    duration_s: float
    prompt_tokens: int
    output_tokens: int
    unit: str | None
    hashes: tuple[str, ...]
    prompt_chars: int | None


def vllm_edges(longest: float) -> list[float]:
    """vLLM's 1-2-5 bucket edges, up to the first at or above ``longest`` (at least 10,000)."""
    edges: list[float] = []
    scale = 1
    while True:
        for step in (1, 2, 5):
            edge = step * scale
            edges.append(float(edge))
            if edge >= max(longest, LEAST_LAST_EDGE):
                return [*edges, math.inf]
        scale *= 10


def histogram(values: Sequence[int]) -> Histogram:
    """Cumulative counts of ``values`` on vLLM's edges, and their sum."""
    ordered = sorted(values)
    cumulative, i = {}, 0
    for edge in vllm_edges(ordered[-1] if ordered else 0):
        while i < len(ordered) and ordered[i] <= edge:
            i += 1
        cumulative[edge] = float(i)
    return Histogram(cumulative, float(sum(ordered)))


def burstiness(arrivals: Sequence[float]) -> float | None:
    """The gamma shape of the gaps between sorted arrivals: mean² / variance; None if few."""
    ordered = sorted(arrivals)
    gaps = [b - a for a, b in zip(ordered, ordered[1:], strict=False)]
    if len(gaps) < MIN_GAPS:
        return None
    mean = math.fsum(gaps) / len(gaps)
    variance = math.fsum((g - mean) ** 2 for g in gaps) / len(gaps)
    if mean <= 0:
        return None  # all at one instant: no gaps to speak of
    if variance <= 0:
        return MAX_BURSTINESS
    return round(min(mean * mean / variance, MAX_BURSTINESS), 3)


def prefix_groups(
    requests: Sequence[Request], levels: Mapping[str, Sequence[int]]
) -> tuple[PrefixGroup, ...]:
    """Shared-prefix groups: each request in the group of its deepest shared level."""
    shared = Counter((r.unit, i, h) for r in requests for i, h in enumerate(r.hashes))
    members: dict[tuple[str | None, int, str], list[Request]] = defaultdict(list)
    for r in requests:
        for i in range(len(r.hashes) - 1, -1, -1):
            key = (r.unit, i, r.hashes[i])
            if shared[key] >= MIN_GROUP_REQUESTS:
                members[key].append(r)
                break
    total = len(requests)
    groups = []
    for (unit, i, _), group in members.items():
        share = math.floor(len(group) / total * 1e4) / 1e4
        if len(group) < MIN_GROUP_REQUESTS or share < MIN_GROUP_SHARE:
            continue
        level = levels[unit or "tokens"][i]
        if unit == "chars":
            tokens = sum(r.prompt_tokens for r in group)
            chars = sum(r.prompt_chars or 0 for r in group)
            length = max(1, round(level * tokens / chars)) if chars else level
        else:
            length = level
        groups.append(PrefixGroup(share=share, length=length))
    groups.sort(key=lambda g: (-g.share, -g.length))
    return tuple(groups[:MAX_GROUPS])


def window_from_records(
    requests: Sequence[Request], levels: Mapping[str, Sequence[int]], *, where: str
) -> Window:
    """The window the records span, as the shape builder takes it."""
    if len(requests) < 2:
        raise UsageError(
            f"{where} holds {len(requests)} request record(s): a shape needs two at least "
            "(their arrivals make the rate); capture later, or over a longer --since"
        )
    arrivals = sorted(r.at for r in requests)
    span = arrivals[-1] - arrivals[0]
    if span <= 0:
        raise UsageError(f"{where}: every request arrived at one instant; capture later")
    ok = [r for r in requests if r.outcome == "ok"]
    end = max(r.at + r.duration_s for r in requests)
    posts = Counter(r.api for r in requests)
    return Window(
        seconds=span,
        prompt=histogram([r.prompt_tokens for r in ok]),
        output=histogram([r.output_tokens for r in ok]),
        running=math.fsum(r.duration_s for r in requests) / (end - arrivals[0]),
        posts={api: float(n) for api, n in posts.items()},
        requests=float(len(requests) - 1),
        groups=prefix_groups(requests, levels),
        burstiness=burstiness(arrivals),
    )


def shape_from_export(data: Any, *, url: str) -> WorkloadShape:
    """The shape of an /admin/requests export (its JSON, parsed)."""
    url = redact(url)  # named in messages and the shape's source only
    if not isinstance(data, dict) or data.get("kind") != "ruleloop.gateway.requests":
        raise ProbeError(f"{url} did not answer with the gateway's request records")
    if data.get("version") != EXPORT_VERSION:
        raise ProbeError(
            f"{url} exports request records version {data.get('version')!r}; this ruleloop "
            f"reads version {EXPORT_VERSION}"
        )
    try:
        levels = {unit: [int(v) for v in values] for unit, values in data["prefix_levels"].items()}
        requests = [
            Request(
                at=float(r["at"]), api=str(r["api"]), outcome=str(r["outcome"]),
                duration_s=float(r["duration_s"]), prompt_tokens=int(r["prompt_tokens"]),
                output_tokens=int(r["output_tokens"]), unit=r.get("prefix_unit"),
                hashes=tuple(r.get("prefix_hashes") or ()), prompt_chars=r.get("prompt_chars"),
            )
            for r in data["records"]
        ]  # fmt: skip
        now = float(data["now"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProbeError(f"{url}: a request record is malformed ({exc!r})") from None
    window = window_from_records(requests, levels, where=url)
    evicted = int(data.get("evicted") or 0)
    note = f", {evicted:,} older evicted" if evicted else ""
    return shape_from_window(
        window,
        source=f"gateway {url} over {_seconds(window.seconds)} s ({len(requests)} requests{note})",
        captured_at=datetime.fromtimestamp(now, UTC),
        where=url,
        longer="--since, or later",
    )


async def capture_from_gateway(
    client: httpx.AsyncClient, base_url: str, *, token: str, since_s: float | None = None
) -> WorkloadShape:
    """Fetch the gateway's records (of the last ``since_s`` seconds, or all) as a shape."""
    fetched = base_url.rstrip("/") + EXPORT_PATH
    params = {} if since_s is None else {"last_s": since_s}
    try:
        response = await client.get(
            fetched, params=params, headers={"Authorization": f"Bearer {token}"}
        )
    except httpx.HTTPError as exc:
        raise EndpointError(
            redact(f"cannot reach the gateway at {base_url}: {exc or type(exc).__name__}")
        ) from exc
    url, shown = redact(fetched), redact(base_url)  # what the messages name
    if response.status_code in (401, 403):
        raise UsageError(
            f"the gateway at {shown} refused the admin token (HTTP {response.status_code}): "
            f"{_message(response)}"
        )
    if response.status_code == 404:
        raise ProbeError(
            f"{url} is not there (HTTP 404): is {shown} a ruleloop gateway recent enough "
            "to keep request records?"
        )
    if response.status_code != 200:
        raise ProbeError(f"{url} answered HTTP {response.status_code}: {_message(response)}")
    try:
        data = response.json()
    except ValueError:
        raise ProbeError(f"{url} answered without JSON") from None
    return shape_from_export(data, url=base_url.rstrip("/"))


def _seconds(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.2f}"


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]
