"""A workload shape: the traffic an engine serves, in a few numbers a person can read and diff.

A shape is versioned (``version: 1``), small, and stored as JSON or YAML (chosen by the file's
suffix: ``.json``, ``.yaml`` or ``.yml``). It holds, field by field (docs/workload.md has an
example file):

- ``version``: the format's version, 1; a file of another version is refused, not guessed at.
- ``source``: how it was captured: ``metrics <URL> over <N> s (<k> scrapes)`` for a capture
  from an engine's /metrics (``bot/diagnosis/probes/workload_capture.py``),
  ``prometheus <URL> <selector> over <N> s to <time>`` for one from Prometheus's history
  (``bot/diagnosis/probes/prometheus_capture.py``), ``gateway <URL> over <N> s (<k> requests)``
  for one from the gateway's request records (``bot/diagnosis/probes/gateway_capture.py``),
  ``file`` for one a person wrote.
- ``captured_at``: when (an ISO 8601 time with its time zone).
- ``api``: ``completions``, ``chat`` or ``unknown``: which OpenAI-compatible API the requests
  used.
- ``prompt_tokens``, ``output_tokens``: length distributions (``Lengths``): the engine's own
  histogram buckets (upper edge in tokens -> share of the requests in that bucket), the number
  of requests, their mean, and the p50/p90/p99 derived from the buckets (kept for replay and
  for files written before; a person is shown each quantile as the bucket it fell in,
  ``TokenRange``).
- ``prefix``: the prefix-cache hit rate over the window and shared-prefix groups, captured by
  the gateway or declared in a file (``Prefix``).
- ``arrivals``: finished requests per second, mean concurrency, burstiness, and how many
  replicas they were read over, per replica or summed over the fleet (``Arrivals``).

Loading a bad file raises ``ShapeError`` (a ``UsageError``): the file, the field and what is
allowed there; never a stack trace.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from bot.kernel import UsageError
from bot.kernel.numbers import (
    Bound,
    Reading,
    histogram_quantile,
    in_unit,
    quantile_bound,
    quantile_bucket,
    show,
)

VERSION = 1
SUFFIXES = {".json": "json", ".yaml": "yaml", ".yml": "yaml"}
API = Literal["completions", "chat", "unknown"]
RatePer = Literal["replica", "fleet"]  # whose rate arrivals.request_rate is
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
INF = "+Inf"
SHARE_SUM_TOLERANCE = 1e-3  # shares are written rounded; they must still add up to 1
QUANTILE_TOLERANCE = 0.5  # tokens: a quantile written in a file must match its buckets


class ShapeError(UsageError):
    """A shape file is unreadable or breaks the format: the file, the field and why."""

    def __init__(self, why: str, *, file: str | None = None, field: str | None = None) -> None:
        self.why, self.file, self.field = why, file, field
        where = ": ".join(part for part in (file, field) if part)
        super().__init__(f"{where}: {why}" if where else why)


def edge_text(edge: float) -> str:
    """A bucket edge as Prometheus writes ``le``, without a trailing '.0': '100', '0.5', '+Inf'."""
    if math.isinf(edge):
        return INF
    return str(int(edge)) if float(edge).is_integer() else repr(float(edge))


def parse_edge(key: object) -> float:
    """A bucket edge from a file: a positive number, or '+Inf' for the last bucket."""
    if isinstance(key, bool):
        raise ValueError(f"bucket edge {key!r} is not a number")
    if isinstance(key, str) and key.strip().lower() in ("+inf", "inf"):
        return math.inf
    try:
        edge = float(key)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(
            f"bucket edge {key!r} is not a number of tokens (write e.g. 100, or +Inf)"
        ) from None
    if math.isnan(edge) or edge <= 0:
        raise ValueError(f"bucket edge {key!r} must be a positive number of tokens, or +Inf")
    return edge


def normalize_buckets(raw: object) -> dict[str, float]:
    """Buckets from a file: edges (numbers or '+Inf') -> shares, checked and sorted by edge."""
    if not isinstance(raw, Mapping) or not raw:
        raise ValueError(
            "write the buckets as a mapping of upper edge (tokens) to share of requests, "
            'e.g. {"100": 0.25, "200": 0.75, "+Inf": 0.0}'
        )
    edges: dict[float, float] = {}
    for key, share in raw.items():
        edge = parse_edge(key)
        if edge in edges:
            raise ValueError(f"bucket edge {key!r} is written twice")
        if isinstance(share, bool) or not isinstance(share, int | float):
            raise ValueError(f"bucket {key!r}: the share {share!r} is not a number")
        if not 0.0 <= float(share) <= 1.0:
            raise ValueError(f"bucket {key!r}: the share {share!r} is not between 0 and 1")
        edges[edge] = float(share)
    total = math.fsum(edges.values())
    if abs(total - 1.0) > SHARE_SUM_TOLERANCE:
        raise ValueError(
            f"the shares add up to {total:.4g}, not 1: each bucket holds its share of all "
            "requests (not a cumulative count)"
        )
    return {edge_text(edge): edges[edge] for edge in sorted(edges)}


def _bounds_text(bounds: object) -> dict[str, str]:
    """A bounds map as plain text, for comparing a file's with the derived one."""
    if not isinstance(bounds, Mapping):
        return {"?": repr(bounds)}
    return {str(k): str(v.value if isinstance(v, Bound) else v) for k, v in bounds.items()}


def derive_quantiles(cumulative: Mapping[float, float]) -> dict[str, Any]:
    """p50/p90/p99 of cumulative buckets, interpolated as Prometheus does; ``bounds`` says
    which are only bounds (first bucket: at most its edge; +Inf bucket: more than the last
    finite edge)."""
    out: dict[str, Any] = {}
    bounds: dict[str, Bound] = {}
    lowest = min(cumulative, default=0.0)
    for name, q in QUANTILES:
        value = histogram_quantile(q, cumulative)
        bound = quantile_bound(q, cumulative)
        if bound is not None:
            bounds[name] = bound
            if bound is Bound.AT_MOST:
                value = lowest  # "at most the first edge", not a point inside [0, edge]
        out[name] = round(value, 1) if value is not None else 0.0
    out["bounds"] = bounds
    return out


@dataclass(frozen=True)
class TokenRange:
    """A length quantile as the histogram knows it: somewhere in the bucket (low, high] its rank
    fell in. ``low`` is 0 for the first bucket (then it is only "at most high"), ``high`` is
    inf for the +Inf bucket (only "more than low"). The one way a length quantile is shown on
    every surface (``text``) and compared (``bot.adr.workload.diff``): never an interpolated point.
    """

    low: float
    high: float

    @property
    def point(self) -> float | None:
        """The length itself when the bucket holds one whole number ((1, 2] holds only 2: token
        counts are whole), else None."""
        if self.low <= 0 or math.isinf(self.high):
            return None
        top = math.floor(self.high)
        return float(top) if top - math.floor(self.low) == 1 else None

    @property
    def least(self) -> float:
        """The smallest length it may be (the lower edge is outside the bucket: a bound)."""
        return self.low if self.point is None else self.point

    @property
    def most(self) -> float:
        """The largest length it may be."""
        return self.high if self.point is None else self.point

    def overlaps(self, other: TokenRange) -> bool:
        """Whether the two may be the same length (buckets are (low, high], so (1,000, 2,000]
        and (2,000, 5,000] do not overlap)."""
        return self.low < other.high and other.low < self.high

    def text(self) -> str:
        """'2,000–5,000', '≤ 1' (first bucket), '> 10,000' (+Inf bucket), '2' (one length)."""
        if self.point is not None:
            return in_unit(self.point, "")
        if self.low <= 0:
            return f"≤ {in_unit(self.high, '')}"
        if math.isinf(self.high):
            return f"> {in_unit(self.low, '')}"
        return f"{in_unit(self.low, '')}–{in_unit(self.high, '')}"


class Lengths(BaseModel):
    """A token-length distribution over requests (prompt or output), as the engine counted it.

    ``buckets``: upper edge in tokens -> share of the requests whose length fell in
    (previous edge, edge], the engine's own edges kept (vLLM: 1, 2, 5, 10, 20, ..., +Inf), so
    two shapes from vLLM compare bucket by bucket; the shares add up to 1. ``count``: how many
    requests the shares are of. ``mean``: their mean length (from the histogram's sum), None
    when not known. ``p50``/``p90``/``p99``: derived from the buckets, interpolated inside a
    bucket as Prometheus's ``histogram_quantile`` does; a quantile in the first bucket is only
    "at most its edge", one in the +Inf bucket only "more than the last finite edge", and
    ``bounds`` says so (``{"p99": ">"}``). A file may leave the quantiles out (they are derived);
    if it writes them, they must match the buckets. The interpolated points are what a replay
    aims at, never what a person is shown: ``quantile`` gives the bucket (``TokenRange``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(ge=1, description="requests the shares are of")
    mean: float | None = Field(default=None, ge=0, description="mean length in tokens")
    p50: float = Field(default=0.0, description="derived from the buckets")
    p90: float = Field(default=0.0, description="derived from the buckets")
    p99: float = Field(default=0.0, description="derived from the buckets")
    bounds: dict[str, Bound] = Field(default_factory=dict, description="quantiles only bounded")
    buckets: dict[str, float] = Field(description="upper edge in tokens -> share of requests")

    @field_validator("buckets", mode="before")
    @classmethod
    def _buckets(cls, raw: object) -> dict[str, float]:
        return normalize_buckets(raw)

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, data: Any) -> Any:
        """Fill in the quantiles from the buckets; refuse written ones that do not match."""
        if not isinstance(data, Mapping):
            return data  # a Lengths already, or an error the fields will report
        try:
            buckets = normalize_buckets(data.get("buckets"))
        except ValueError:
            return data  # reported against the buckets field
        cumulative, running = {}, 0.0
        for key, share in buckets.items():
            running += share
            cumulative[parse_edge(key)] = running
        derived = derive_quantiles(cumulative)
        for name, _ in QUANTILES:
            given, want = data.get(name), derived[name]
            if isinstance(given, int | float) and abs(given - want) > QUANTILE_TOLERANCE:
                raise ValueError(
                    f"{name} is {given:g} but the buckets give {want:g}: the quantiles are "
                    "derived from the buckets; leave them out or fix the buckets"
                )
        given_bounds = data.get("bounds")
        if given_bounds is not None and _bounds_text(given_bounds) != _bounds_text(
            derived["bounds"]
        ):
            raise ValueError(
                f"bounds {_bounds_text(given_bounds)} do not match the buckets, which give "
                f"{_bounds_text(derived['bounds'])}: the bounds are derived; leave them out"
            )
        return {**data, **derived}

    def edges(self) -> list[float]:
        """The bucket edges, lowest first (+Inf as math.inf)."""
        return [parse_edge(key) for key in self.buckets]

    def cumulative(self) -> dict[float, float]:
        """Share of requests at or below each edge (the last is 1)."""
        out, running = {}, 0.0
        for key, share in self.buckets.items():
            running += share
            out[parse_edge(key)] = running
        return out

    def reading(self, name: str) -> Reading:
        """One derived quantile ('p50', 'p90', 'p99') with its bound, if it is one: the point
        interpolated inside its bucket, for replay; a person is shown ``quantile``."""
        return Reading(float(getattr(self, name)), self.bounds.get(name))

    def quantile(self, name: str) -> TokenRange:
        """One quantile ('p50', 'p90', 'p99') as the buckets know it: the bucket it fell in."""
        found = quantile_bucket(dict(QUANTILES)[name], self.cumulative())
        assert found is not None  # count >= 1 and the shares add up to 1
        return TokenRange(*found)

    @classmethod
    def from_cumulative(cls, counts: Mapping[float, float], *, total: float | None) -> Lengths:
        """From a histogram's cumulative counts by edge (a window's deltas) and its sum."""
        edges = sorted(counts)
        count = counts[edges[-1]] if edges else 0.0
        if count <= 0:
            raise ValueError("the histogram holds no observation")
        shares, previous = {}, 0.0
        for edge in edges:
            shares[edge_text(edge)] = round(max(counts[edge] - previous, 0.0) / count, 6)
            previous = counts[edge]
        mean = None if total is None else round(total / count, 1)
        return cls(count=int(round(count)), mean=mean, buckets=shares)

    def summary(self) -> str:
        """'p50 200–500, p90 200–500, p99 500–1,000 (95 requests, mean 239)'."""
        parts = [f"{name} {self.quantile(name).text()}" for name, _ in QUANTILES]
        mean = "" if self.mean is None else f", mean {show('tokens', self.mean)}"
        return f"{', '.join(parts)} ({self.count:,} requests{mean})"


class PrefixGroup(BaseModel):
    """A group of requests that share one prefix (a system prompt, a few-shot block): the share
    of all requests in the group and the prefix's length in tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    share: float = Field(gt=0, le=1, description="share of all requests in this group")
    length: int = Field(ge=1, description="the shared prefix's length in tokens")


class Prefix(BaseModel):
    """Prefix sharing. ``hit_rate``: the prefix-cache hit rate over the window, in tokens (vLLM's
    prefix_cache_hits / prefix_cache_queries), None when the engine exposes no prefix-cache
    counters or nothing was queried (and from the gateway, which does not see the cache).
    ``groups``: shared-prefix groups, captured from the gateway's request records (requests
    whose prompts hash alike up to a level: the group's length is that level, a lower bound
    within 2x; ``bot/diagnosis/probes/gateway_capture.py``) or declared by a person in a file.
    A capture from /metrics or Prometheus can only give the hit rate: the engine does not say
    which requests shared which prefix, so such a shape has no groups."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hit_rate: float | None = Field(default=None, ge=0, le=1, description="hits / queries")
    groups: tuple[PrefixGroup, ...] = Field(
        default=(), description="captured by the gateway, or declared in a file"
    )

    @field_validator("groups")
    @classmethod
    def _shares(cls, groups: tuple[PrefixGroup, ...]) -> tuple[PrefixGroup, ...]:
        total = math.fsum(group.share for group in groups)
        if total > 1.0 + 1e-9:
            raise ValueError(f"the groups' shares add up to {total:.4g}: at most 1 in all")
        return groups


class Arrivals(BaseModel):
    """How requests arrive. ``request_rate``: requests finished per second over the window (the
    engine counts a request when it ends, so over a window long against one request this is
    the arrival rate; from the gateway's records it is the arrival rate itself).
    ``concurrency``: requests running, the engine's gauge averaged over the scrapes (None when
    not exposed; from the gateway: requests in flight there, running or waiting, by Little's
    law). ``burstiness``: the shape of gamma-distributed gaps between arrivals as
    ``vllm bench serve --burstiness`` takes it (1 Poisson, below 1 burstier, above 1 more even);
    None when unknown. Captured from the gateway's arrival times (mean² / variance of the
    gaps); a capture from /metrics or Prometheus does not know it.

    ``replicas`` and ``per``: how many engine replicas the rate and concurrency were read over,
    and whether they are each replica's (``replica``: one pod's /metrics, or a fleet's divided
    by its replicas) or the whole fleet's summed (``fleet``: a merged fleet window, Prometheus
    summing over engines). A shape written before these fields is one replica, per replica.
    Two shapes read over different replica counts compare their rates per replica
    (``per_replica_rate``), so an autoscaler adding replicas is not drift."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_rate: float = Field(gt=0, description="finished requests per second")
    concurrency: float | None = Field(default=None, ge=0, description="mean requests running")
    burstiness: float | None = Field(default=None, gt=0, description="gamma shape; 1 = Poisson")
    replicas: int = Field(default=1, ge=1, description="engine replicas it was read over")
    per: RatePer = Field(default="replica", description="rates of each replica, or the fleet's")

    @property
    def per_replica_rate(self) -> float:
        """Requests per second on one replica: the fleet's rate divided by its replicas."""
        return self.request_rate / self.replicas if self.per == "fleet" else self.request_rate

    @property
    def basis(self) -> str:
        """What the rate is of, for a person: 'per replica', 'over a fleet of 4 replicas'."""
        if self.per == "fleet":
            return f"over a fleet of {self.replicas} replicas"
        return "per replica" if self.replicas == 1 else f"per replica (of {self.replicas})"


class WorkloadShape(BaseModel):
    """A workload shape, version 1 (the module docstring and docs/workload.md: field by field)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = Field(description="the format's version")
    source: str = Field(min_length=1, description="how it was captured")
    captured_at: AwareDatetime = Field(description="when, with its time zone")
    api: API = Field(default="unknown", description="the OpenAI-compatible API used")
    prompt_tokens: Lengths
    output_tokens: Lengths
    prefix: Prefix = Field(default_factory=Prefix)
    arrivals: Arrivals

    def summary(self) -> list[str]:
        """A few lines for a person: what the shape says."""
        rate = self.arrivals.request_rate
        concurrency = self.arrivals.concurrency
        hit = self.prefix.hit_rate
        return [
            f"source: {self.source}, captured {self.captured_at.isoformat(timespec='seconds')}",
            f"api: {self.api}",
            f"prompt tokens: {self.prompt_tokens.summary()}",
            f"output tokens: {self.output_tokens.summary()}",
            "prefix-cache hit rate: "
            + ("n/a" if hit is None else show("hit_rate", hit))
            + (f", {len(self.prefix.groups)} shared-prefix groups" if self.prefix.groups else ""),
            f"arrivals: {show('tokens', rate)} requests/s finished"
            + ("" if concurrency is None else f", {show('tokens', concurrency)} running on average")
            + ("" if self.arrivals.replicas == 1 else f" ({self.arrivals.basis})"),
        ]


def file_format(path: Path) -> str:
    """'json' or 'yaml' by the file's suffix; ShapeError for any other."""
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise ShapeError(
            f"a shape file ends in .json, .yaml or .yml (not {path.suffix or 'no suffix'!r})",
            file=str(path),
        )
    return kind


def dumps(shape: WorkloadShape, kind: str) -> str:
    """The shape as JSON or YAML text."""
    data = shape.model_dump(mode="json")
    if kind == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def save(shape: WorkloadShape, path: Path) -> None:
    """Write the shape to ``path``, JSON or YAML by its suffix."""
    text = dumps(shape, file_format(path))
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ShapeError(f"cannot write: {exc.strerror or exc}", file=str(path)) from None


def load(path: Path) -> WorkloadShape:
    """Read a shape file; ShapeError naming the file, the field and what is allowed."""
    kind = file_format(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ShapeError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
    except UnicodeDecodeError:
        raise ShapeError("not a text file (UTF-8)", file=str(path)) from None
    return parse(text, kind=kind, name=str(path))


def parse(text: str, *, kind: str, name: str = "shape") -> WorkloadShape:
    """A shape from JSON or YAML text; ShapeError naming ``name``, the field and why."""
    try:
        data = json.loads(text) if kind == "json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ShapeError(f"not valid {kind.upper()}: {exc}", file=name) from None
    if not isinstance(data, Mapping):
        raise ShapeError(
            f"holds {type(data).__name__ if data is not None else 'nothing'}, not a shape "
            f"(a mapping with version, source, captured_at, prompt_tokens, ...)",
            file=name,
        )
    if data.get("version") != VERSION and "version" in data:
        raise ShapeError(
            f"version {data['version']!r}: this ruleloop reads shape version {VERSION}",
            file=name,
            field="version",
        )
    try:
        return WorkloadShape.model_validate(dict(data))
    except ValidationError as exc:
        field, why = explain(exc)
        raise ShapeError(why, file=name, field=field) from None


def explain(exc: ValidationError) -> tuple[str, str]:
    """The first error's field (dotted) and why, with what is allowed there."""
    error = exc.errors()[0]
    loc = tuple(error["loc"])
    field = ".".join(str(part) for part in loc) or "shape"
    kind = error["type"]
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        allowed = ", ".join(model.model_fields) if model is not None else "see docs/workload.md"
        why = f"unknown field; allowed here: {allowed}"
    elif kind == "missing":
        why = "required (docs/workload.md lists every field)"
    else:
        why = str(error["msg"]).removeprefix("Value error, ")
        if kind.startswith("timezone") or kind.startswith("datetime"):
            why += " (write e.g. 2026-09-01T12:00:00Z)"
    more = exc.error_count() - 1
    return field, why + (f" (and {more} more)" if more else "")


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model whose field ``loc`` leads into (list indexes skipped)."""
    model: type[BaseModel] = WorkloadShape
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        candidates = [field.annotation, *get_args(field.annotation)]
        inner = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if inner is None:
            return None
        model = inner
    return model


def new_shape(
    *,
    source: str,
    captured_at: datetime,
    prompt_tokens: Lengths,
    output_tokens: Lengths,
    prefix: Prefix,
    arrivals: Arrivals,
    api: str = "unknown",
) -> WorkloadShape:
    """A version-1 shape from its parts (validated like a file)."""
    return WorkloadShape.model_validate(
        {
            "version": VERSION,
            "source": source,
            "captured_at": captured_at,
            "api": api,
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
            "prefix": prefix,
            "arrivals": arrivals,
        }
    )


def per_replica(shape: WorkloadShape) -> WorkloadShape:
    """The shape as one replica's share of its fleet (rate and concurrency divided by its
    replicas): what a canary replays on one engine. A per-replica shape is returned as is."""
    arrivals = shape.arrivals
    if arrivals.per == "replica":
        return shape
    share: dict[str, object] = {"request_rate": arrivals.per_replica_rate, "per": "replica"}
    if arrivals.concurrency is not None:
        share["concurrency"] = arrivals.concurrency / arrivals.replicas
    return shape.model_copy(update={"arrivals": arrivals.model_copy(update=share)})
