"""A target's replicas from the vllm-router in front of them: the workers it routes to.

    GET {router_url}/workers
    {"workers": [{"url": "http://10.1.0.7:8000", "worker_type": "regular",
                  "is_healthy": true, "load": 0, ...}], "total": 2, "stats": {...}}

(vllm-router 0.1.17; its /list_workers gives the URLs alone.) Each healthy regular worker is one
replica; an unhealthy one is left out, as the router sends it nothing. Every worker's address
is checked as a Service's endpoints are (kube_endpoints.checked_host: an IP in
``kubernetes_networks``) before the bot fetches it, since the router's list is not the bot's
configuration. Prefill and decode workers (``--vllm-pd-disaggregation``: ``worker_type``
"prefill" or "decode", a prefill one with its ``bootstrap_port``) are the target's two pools,
each replica tagged with its own (docs/fleet.md "Prefill and decode pools"): a router with
both pools, each with a healthy worker, and no regular worker beside them.

Every failure (router down, an answer that is not vllm-router's, no healthy worker) is a
ProbeError that says what to do: an empty fleet would read as a target that served nothing.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx

from bot.diagnosis.probes.kube_endpoints import checked_host
from bot.diagnosis.probes.replicas import POOLS, Pool, Replica
from bot.kernel import POD_NETWORKS, ProbeError

TIMEOUT_S = 10.0
_DP_RANK = re.compile(r"@\d+$")  # a data-parallel rank of one server: one /metrics page


async def discover_workers(
    router_url: str,
    *,
    networks: Sequence[str] = POD_NETWORKS,
    max_replicas: int = 64,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[Replica]:
    """The healthy workers of the vllm-router at ``router_url`` as replicas."""
    base = router_url.rstrip("/")
    async with httpx.AsyncClient(timeout=TIMEOUT_S, transport=transport) as http:
        workers = await _list_workers(http, base)
    return replicas_of_workers(workers, router=base, networks=networks, max_replicas=max_replicas)


async def _list_workers(http: httpx.AsyncClient, base: str) -> list[Any]:
    where = f"the workers of the router at {base}"
    try:
        response = await http.get(f"{base}/workers", headers={"Accept": "application/json"})
    except httpx.HTTPError as exc:
        raise ProbeError(
            f"cannot read {where}: it did not answer ({type(exc).__name__}: {exc}); check "
            "router_url and that the router runs"
        ) from exc
    if response.is_error:
        raise ProbeError(
            f"cannot read {where} (GET /workers answered {response.status_code}: "
            f"{response.text[:200]!r}): is router_url a vllm-router?"
        )
    try:
        workers = response.json()["workers"]
    except (ValueError, KeyError, TypeError):
        raise ProbeError(
            f"cannot read {where}: GET /workers answered without a worker list: is router_url "
            "a vllm-router?"
        ) from None
    if not isinstance(workers, list):
        raise ProbeError(f"cannot read {where}: its `workers` is not a list")
    return workers


def replicas_of_workers(
    workers: Sequence[Any],
    *,
    router: str,
    networks: Sequence[str] = POD_NETWORKS,
    max_replicas: int = 64,
) -> list[Replica]:
    """The replicas the router's workers name: each healthy worker once, in the router's
    order (a prefill or decode worker tagged with its pool); any refused worker refuses the
    whole list (ProbeError)."""
    allowed = [ipaddress.ip_network(n) for n in networks]
    found: dict[str, Replica] = {}
    unhealthy: list[str] = []
    refused: list[str] = []
    for worker in workers:
        if not isinstance(worker, Mapping) or not isinstance(worker.get("url"), str):
            raise ProbeError(f"the router at {router}: a worker is not an object with a url")
        pool = _pool_of(router, worker.get("worker_type", "regular"))
        url, why = _checked_url(worker["url"], allowed)
        if url is None:
            refused.append(why)
        elif worker.get("is_healthy") is False:
            unhealthy.append(url)
        elif found.setdefault(url, Replica(url, pool=pool)).pool != pool:
            raise ProbeError(
                f"the router at {router} lists {url} as a {found[url].pool or 'regular'} "
                f"worker and as a {pool or 'regular'} one: an engine serves one pool; fix the "
                "router's --prefill/--decode lists"
            )
    _refuse(router, found, unhealthy, refused, networks, max_replicas)
    _refuse_pools(router, found.values(), unhealthy)
    return list(found.values())


def _pool_of(router: str, kind: object) -> Pool | None:
    """The pool of a worker_type: None for a regular worker (ProbeError for an unknown one)."""
    if kind == "regular":
        return None
    for pool in POOLS:
        if kind == pool:
            return pool
    raise ProbeError(
        f"the router at {router} routes to a worker of type {str(kind)[:40]!r}: the bot reads "
        "regular, prefill and decode workers only; list the replicas instead"
    )


def _refuse_pools(router: str, found: Iterable[Replica], unhealthy: Sequence[str]) -> None:
    """A ProbeError when prefill/decode workers do not make two pools: both are needed (the
    prefill pool's TTFT, the decode pool's TPOT), and regular workers beside them would be
    neither."""
    pools = [r.pool for r in found]
    if not any(pools):
        return
    if None in pools:
        raise ProbeError(
            f"the router at {router} routes to regular workers beside prefill/decode ones: the "
            "bot reads either one fleet of like engines or two pools; list the pools in "
            "prefill_replicas and decode_replicas instead"
        )
    for pool in POOLS:
        if pool not in pools:
            have = "decode" if pool == "prefill" else "prefill"
            waiting = f" ({len(unhealthy)} unhealthy: {', '.join(unhealthy)})" if unhealthy else ""
            raise ProbeError(
                f"the router at {router} routes to {have} workers (prefill/decode "
                f"disaggregation) but to no healthy {pool} worker{waiting}: its {pool} pool "
                "serves nothing now; its log and GET /workers say why"
            )


def _refuse(
    router: str,
    found: Mapping[str, Replica],
    unhealthy: Sequence[str],
    refused: Sequence[str],
    networks: Sequence[str],
    max_replicas: int,
) -> None:
    """A ProbeError when the workers found are not a fleet the bot may read."""
    if refused:
        more = f"; and {len(refused) - 3} more" if len(refused) > 3 else ""
        raise ProbeError(
            f"the router at {router}: {len(refused)} worker address(es) refused, nothing was "
            f"scraped: {'; '.join(refused[:3])}{more}. A worker's address must be an IP in "
            f"kubernetes_networks ({', '.join(networks)}); list the replicas instead if the "
            "router names its workers by host name"
        )
    if len(found) > max_replicas:
        raise ProbeError(
            f"the router at {router} has more than {max_replicas} healthy workers: nothing was "
            "scraped; raise kubernetes_max_replicas if the fleet is really that large"
        )
    if not found:
        waiting = f" ({len(unhealthy)} unhealthy: {', '.join(unhealthy)})" if unhealthy else ""
        raise ProbeError(
            f"the router at {router} routes to no healthy worker{waiting}: no engine serves "
            "it now; its log and GET /workers say why"
        )


def _checked_url(text: str, allowed: Sequence[Any]) -> tuple[str | None, str]:
    """A worker's URL as a replica's (``http://IP:PORT``), or None and why it is refused."""
    parts = urlsplit(_DP_RANK.sub("", text))
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        return None, f"{text[:60]!r} is not an http(s) URL"
    try:
        family = f"IPv{ipaddress.ip_address(parts.hostname).version}"
    except ValueError:
        return None, f"{parts.hostname[:60]!r} is a host name, not an IP"
    host, why = checked_host(parts.hostname, family=family, allowed=allowed)
    if host is None:
        return None, why
    return f"{parts.scheme}://{host}:{port}", ""
