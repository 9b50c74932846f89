"""A target's replicas from a Gateway API Inference Extension InferencePool (llm-d, GKE, kgateway).

An InferencePool names the model servers an inference gateway's endpoint picker routes to: the
pods its selector matches, on its target port. The bot reads the pool, then those pods:

    GET /apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools/{name}
        spec.selector.matchLabels, spec.targetPorts[0].number            (v1, the GA API)
    GET /apis/inference.networking.x-k8s.io/v1alpha2/namespaces/{ns}/inferencepools/{name}
        spec.selector (labels), spec.targetPortNumber                    (v1alpha2, when v1 is 404)
    GET /api/v1/namespaces/{ns}/pods?labelSelector=k=v,...

Each pod that is Ready (its condition ``Ready`` is "True") and not being deleted is one replica,
``http://<podIP>:<port>``, with its pod and node; each address is checked as a Service's
endpoints are (``kube_endpoints.checked_host``: an IP inside kubernetes_networks). Every
failure is a ProbeError that says what to do: never an empty fleet.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from bot.diagnosis.probes.kube_endpoints import api_client, checked_host
from bot.diagnosis.probes.replicas import Replica
from bot.kernel import POD_NETWORKS, KubernetesApiSpec, ProbeError
from bot.kernel.runtime import kube_client

# (path prefix, API version) of each InferencePool API, newest first
POOL_APIS = (
    ("/apis/inference.networking.k8s.io/v1", "inference.networking.k8s.io/v1"),
    ("/apis/inference.networking.x-k8s.io/v1alpha2", "inference.networking.x-k8s.io/v1alpha2"),
)
RBAC_HINT = (
    "grant the bot's service account get on inferencepools (apiGroup "
    "inference.networking.k8s.io, or inference.networking.x-k8s.io for v1alpha2) and list on "
    "pods in namespace {ns}"
)


async def discover_pool(
    pool: str,
    *,
    api: KubernetesApiSpec,
    networks: Sequence[str] = POD_NETWORKS,
    max_replicas: int = 64,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[Replica]:
    """The ready pods of InferencePool ``pool`` (namespace/name) as replicas."""
    namespace, _, name = pool.partition("/")
    async with api_client(api, transport=transport) as http:
        labels, port = selector_of(await _read_pool(http, namespace, name), pool=pool)
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        pods = await get_object(http, f"/api/v1/namespaces/{namespace}/pods",
                          what=f"the pods of InferencePool {pool}", namespace=namespace,
                          params={"labelSelector": selector})  # fmt: skip
    return replicas_of_pods(pods.get("items"), pool=pool, port=port, networks=networks,
                            max_replicas=max_replicas)  # fmt: skip


async def _read_pool(http: httpx.AsyncClient, namespace: str, name: str) -> Mapping[str, Any]:
    """The pool object from the first API that has it."""
    for prefix, version in POOL_APIS:
        path = f"{prefix}/namespaces/{namespace}/inferencepools/{name}"
        found = await get_object(http, path, what=f"InferencePool {namespace}/{name} ({version})",
                           namespace=namespace, missing_ok=True)  # fmt: skip
        if found:
            return found
    raise ProbeError(
        f"InferencePool {namespace}/{name} not found (asked {', '.join(v for _, v in POOL_APIS)}):"
        " check `kubectl get inferencepools -n " + namespace + "` and fix inference_pool"
    )


async def get_object(
    http: httpx.AsyncClient,
    path: str,
    *,
    what: str,
    namespace: str,
    params: Mapping[str, str] | None = None,
    missing_ok: bool = False,
    rbac_hint: str = RBAC_HINT,
) -> Mapping[str, Any]:
    """One JSON object from the API ({} for a 404 when ``missing_ok``); failures said (a 403
    with ``rbac_hint``, its ``{ns}`` the namespace)."""
    try:
        response = await http.get(path, params=params, headers={"Accept": "application/json"})
    except httpx.HTTPError as exc:
        raise ProbeError(
            f"cannot read {what}: the Kubernetes API at {http.base_url} did not answer "
            f"({type(exc).__name__}: {exc}); check the target's kubernetes_api.api_url"
        ) from exc
    if response.status_code == 404 and missing_ok:
        return {}
    if response.is_error:
        code, message = response.status_code, kube_client.status_message(response)
        hint = {401: "the token in kubernetes_api.token_file was refused",
                403: rbac_hint.format(ns=namespace)}.get(code)  # fmt: skip
        raise ProbeError(f"cannot read {what} ({code}: {message})" + (f"; {hint}" if hint else ""))
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, Mapping):
        raise ProbeError(f"cannot read {what}: {http.base_url} answered without a JSON object")
    return body


def selector_of(obj: Mapping[str, Any], *, pool: str) -> tuple[dict[str, str], int]:
    """The pool's pod labels and target port, from either API version."""
    spec = obj.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    selector = spec.get("selector")
    if isinstance(selector, Mapping) and "matchLabels" in selector:  # v1: a LabelSelector
        selector = selector.get("matchLabels")
    labels = selector
    ports = spec.get("targetPorts")
    if isinstance(ports, list) and ports and isinstance(ports[0], Mapping):
        number = ports[0].get("number")
    else:
        number = spec.get("targetPortNumber")
    if (
        not isinstance(labels, Mapping)
        or not labels
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
    ):
        raise ProbeError(f"InferencePool {pool}: its selector names no pod labels")
    if type(number) is not int or not 1 <= number <= 65535:
        raise ProbeError(f"InferencePool {pool}: its target port is not a number 1-65535")
    return dict(labels), number


def replicas_of_pods(
    items: object,
    *,
    pool: str,
    port: int,
    networks: Sequence[str] = POD_NETWORKS,
    max_replicas: int = 64,
) -> list[Replica]:
    """Each Ready pod not being deleted, once, as a replica; any refused address refuses all."""
    if not isinstance(items, list):
        raise ProbeError(f"InferencePool {pool}: the pods list has no `items` list")
    allowed = [ipaddress.ip_network(n) for n in networks]
    found: list[Replica] = []
    refused, not_ready = [], []
    for pod in items:
        meta, status = part(pod, "metadata"), part(pod, "status")
        name = str(meta.get("name") or "?")
        if meta.get("deletionTimestamp") or not pod_ready(status):
            not_ready.append(name)
            continue
        address = status.get("podIP")
        family = f"IPv{6 if isinstance(address, str) and ':' in address else 4}"
        host, why = checked_host(address, family=family, allowed=allowed)
        if host is None:
            refused.append(f"{name}: {why}")
            continue
        node = part(pod, "spec").get("nodeName")
        found.append(Replica(f"http://{host}:{port}", pod=name,
                             node=node if isinstance(node, str) else None))  # fmt: skip
    if refused:
        raise ProbeError(
            f"InferencePool {pool}: {len(refused)} pod address(es) refused, nothing was "
            f"scraped: {'; '.join(refused[:3])}. A pod's address must be an IP in "
            f"kubernetes_networks ({', '.join(networks)})"
        )
    if len(found) > max_replicas:
        raise ProbeError(
            f"InferencePool {pool} selects more than {max_replicas} ready pods: nothing was "
            "scraped; raise kubernetes_max_replicas if the pool is really that large"
        )
    if not found:
        waiting = f" ({len(not_ready)} not ready: {', '.join(not_ready[:5])})" if not_ready else ""
        raise ProbeError(
            f"InferencePool {pool} selects no ready pod{waiting}: no model server serves it now"
        )
    return found


def part(obj: object, field: str) -> Mapping[str, Any]:
    """An object's field that is itself an object ({} when absent or not one)."""
    value = obj.get(field) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def pod_ready(status: Mapping[str, Any]) -> bool:
    """A pod's status says Ready: its condition ``Ready`` is "True"."""
    conditions = status.get("conditions")
    return isinstance(conditions, list) and any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in conditions
    )
