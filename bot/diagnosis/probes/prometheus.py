"""The Prometheus probe: PromQL range queries over the last N minutes, when a target has one.

Queries are written in the runbook; ``$instance`` in a query becomes the target's host:port
(how Prometheus labels the engine), and ``$instances`` a regular expression that matches the
host:port of each of the target's replicas (a fleet's, discovered as its window discovers them;
one engine's alone otherwise): ``{instance=~"$instances"}``. Each query yields two readings:
`<name>_last`, `<name>_max`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx
from pydantic import Field, field_validator

from bot.diagnosis.probes.context import ProbeContext, TargetRef
from bot.diagnosis.probes.types import Finding, Params, ProbeResult, Severity
from bot.kernel import EndpointError, ProbeError
from bot.kernel.numbers import Measured
from bot.kernel.runtime.redact import redact


class PrometheusParams(Params):
    """Which queries, over how many minutes, at what resolution."""

    minutes: float = Field(default=15, gt=0, le=24 * 60)
    step_s: float = Field(default=15, gt=0, le=3600)
    queries: dict[str, str] = Field(min_length=1)

    @field_validator("queries")
    @classmethod
    def _names(cls, queries: dict[str, str]) -> dict[str, str]:
        for name, expr in queries.items():
            if not name.isidentifier():
                raise ValueError(f"query name {name!r} must be an identifier (it names readings)")
            if not expr.strip():
                raise ValueError(f"query {name!r} is empty")
        return queries


class PrometheusProbe:
    """Range queries against the target's Prometheus."""

    name: ClassVar[str] = "prometheus"
    params_model: ClassVar[type[Params]] = PrometheusParams

    def readings(self, params: Params) -> Mapping[str, str]:
        """`<query>_last` and `<query>_max` for each query of the runbook."""
        assert isinstance(params, PrometheusParams)
        out = {}
        for name, expr in params.queries.items():
            out[f"{name}_last"] = f"last value of {expr}"
            out[f"{name}_max"] = f"largest value of {expr} over the range"
        return out

    async def run(self, *, target: TargetRef, params: Params, ctx: ProbeContext) -> ProbeResult:
        """Run every query; without a Prometheus URL say so and read nothing."""
        assert isinstance(params, PrometheusParams)
        url = target.target.prometheus_url
        if url is None:
            message = f"no prometheus_url configured for {target.name}; history not read"
            return ProbeResult(findings=[Finding(Severity.INFO, message, self.name)])
        instances = None
        if any("$instances" in expr for expr in params.queries.values()):
            replicas = await ctx.replicas(target.target)
            instances = instances_regex(urlsplit(r.url).netloc.rpartition("@")[2] for r in replicas)
        readings, series = await read_queries(
            ctx, url, params, instances=instances, instance=target.target.hostport
        )
        return ProbeResult(readings=Measured.of(readings), details={"series": series})


async def read_queries(
    ctx: ProbeContext,
    url: str,
    params: PrometheusParams,
    *,
    instances: str | None,
    instance: str,
) -> tuple[dict[str, float | None], dict[str, list[tuple[float, float]]]]:
    """Each query of ``params`` over its last minutes, ``$instances`` as ``instances`` (an
    ``instances_regex``) and ``$instance`` as ``instance``: its readings and its series. The
    diagnosis reads the fleet's queries again for one slow replica with this
    (bot/diagnosis/replica_gpus.py)."""
    end = ctx.wall_clock()
    start = end - params.minutes * 60
    readings: dict[str, float | None] = {}
    series: dict[str, list[tuple[float, float]]] = {}
    for name, expr in params.queries.items():
        if instances is not None:
            expr = expr.replace("$instances", instances)
        query = expr.replace("$instance", instance)
        points = await query_range(
            ctx.http, url, query=query, start=start, end=end, step_s=params.step_s
        )
        values = [v for _, v in points if not math.isnan(v)]
        readings[f"{name}_last"] = values[-1] if values else None
        readings[f"{name}_max"] = max(values) if values else None
        series[name] = points
    return readings, series


def instances_regex(addresses: Iterable[str]) -> str:
    """The replicas' host:ports as one RE2 alternation, written for a double-quoted PromQL
    string (Prometheus anchors it: no other instance matches)."""
    alternation = "|".join(re.escape(a) for a in dict.fromkeys(addresses))
    return alternation.replace("\\", "\\\\").replace('"', '\\"')


async def query_range(
    client: httpx.AsyncClient, base_url: str, *, query: str, start: float, end: float,
    step_s: float,
) -> list[tuple[float, float]]:  # fmt: skip
    """One /api/v1/query_range call; the series summed point by point (a matrix of one query)."""
    try:
        response = await client.get(
            f"{base_url.rstrip('/')}/api/v1/query_range",
            params={"query": query, "start": start, "end": end, "step": step_s},
        )
    except httpx.HTTPError as exc:
        raise EndpointError(redact(f"cannot reach Prometheus at {base_url}: {exc}")) from exc
    try:
        body: dict[str, Any] = response.json()
    except ValueError:
        raise ProbeError(
            redact(f"{base_url} answered HTTP {response.status_code} without JSON")
        ) from None
    if body.get("status") != "success":
        raise ProbeError(
            redact(f"Prometheus refused {query!r}: {body.get('error', response.status_code)}")
        )
    summed: dict[float, float] = {}
    for result in body.get("data", {}).get("result", []):
        for t, v in result.get("values", []):
            summed[float(t)] = summed.get(float(t), 0.0) + float(v)
    return sorted(summed.items())
