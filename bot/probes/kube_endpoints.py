"""A target's replicas from the Kubernetes API: the ready endpoints of a Service.

    GET /apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices
        ?labelSelector=kubernetes.io/service-name={name}

The Service's EndpointSlices list every pod behind it, one address each (a pod's IP), with the
Service's ports. An endpoint whose ``conditions.ready`` is false is left out (the API says an
unset ``ready`` means ready): the Service sends it no traffic, so its numbers are not the
target's. Each ready address with the chosen port is one replica, with its pod and node.

Every failure (API unreachable, 401/403, no slice, no ready endpoint, no such port) is a
ProbeError that says what to do: an empty fleet would read as a target that served nothing.

The API is read with the client the Kubernetes actuator uses (bot.runtime.kube_client): a
bearer token read from its file on every request and the cluster's CA.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from bot.config import KubernetesApiSpec
from bot.errors import ProbeError
from bot.probes.replicas import Replica
from bot.runtime import kube_client

SERVICE_LABEL = "kubernetes.io/service-name"
RBAC_HINT = (
    "grant the bot's service account get and list on endpointslices (apiGroup "
    "discovery.k8s.io) in namespace {ns}: a rule in its Role (deploy/kubernetes/base/rbac.yaml)"
)


def api_client(
    api: KubernetesApiSpec, *, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """A client of the API (bot.runtime.kube_client) whose token and CA failures are
    ProbeErrors."""
    return kube_client.client(
        api.api_url, token_file=api.token_file, ca_file=api.ca_file, error=ProbeError,
        transport=transport,
    )  # fmt: skip


async def discover(
    service: str,
    *,
    port: str | None,
    api: KubernetesApiSpec,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[Replica]:
    """The ready endpoints of Service ``service`` (namespace/name) as replicas."""
    namespace, _, name = service.partition("/")
    async with api_client(api, transport=transport) as http:
        slices = await _list_slices(http, namespace, name)
    return replicas_in(slices, service=service, port=port)


async def _list_slices(http: httpx.AsyncClient, namespace: str, name: str) -> list[Any]:
    path = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
    where = f"the EndpointSlices of Service {namespace}/{name}"
    try:
        response = await http.get(
            path,
            params={"labelSelector": f"{SERVICE_LABEL}={name}"},
            headers={"Accept": "application/json"},
        )
    except httpx.HTTPError as exc:
        raise ProbeError(
            f"cannot read {where}: the Kubernetes API at {http.base_url} did not answer "
            f"({type(exc).__name__}: {exc}); check the target's kubernetes_api.api_url"
        ) from exc
    if response.is_error:
        raise ProbeError(_error_text(response, where, namespace))
    try:
        body = response.json()
        items = body["items"]
    except (ValueError, KeyError, TypeError):
        raise ProbeError(
            f"cannot read {where}: {http.base_url} answered without an EndpointSliceList: "
            "is kubernetes_api.api_url really the Kubernetes API?"
        ) from None
    if not isinstance(items, list):
        raise ProbeError(f"cannot read {where}: its `items` is not a list")
    return items


def _error_text(response: httpx.Response, where: str, namespace: str) -> str:
    """What a failed list means and what to do about it."""
    code, message = response.status_code, kube_client.status_message(response)
    text = f"cannot read {where} ({code}: {message})"
    if code == 401:
        return f"{text}; the token in kubernetes_api.token_file was refused"
    if code == 403:
        return f"{text}; {RBAC_HINT.format(ns=namespace)}"
    if code == 404:
        return f"{text}; the API serves no discovery.k8s.io/v1 (Kubernetes 1.21 or later needed)"
    return text


def replicas_in(slices: Sequence[Any], *, service: str, port: str | None) -> list[Replica]:
    """The replicas the slices list: each ready address on the port named ``port`` (unset:
    the Service's only port), in the API's order, each once."""
    if not slices:
        raise ProbeError(
            f"Service {service} has no EndpointSlices: check that the Service exists and has a "
            "selector (the EndpointSlice controller makes slices only for those), or fix "
            "kubernetes_service"
        )
    found: dict[str, Replica] = {}
    not_ready: list[str] = []
    for item in slices:
        for endpoint in item.get("endpoints") or []:
            ref = endpoint.get("targetRef") or {}
            pod = ref.get("name") if ref.get("kind") == "Pod" else None
            addresses = endpoint.get("addresses") or []
            if (endpoint.get("conditions") or {}).get("ready") is False:
                not_ready.append(pod or ", ".join(addresses))
                continue
            number = _port_of(item, service=service, wanted=port)
            for address in addresses[:1]:  # the API holds exactly one address per endpoint
                url = f"http://{_host(address)}:{number}"
                found.setdefault(url, Replica(url, pod=pod, node=endpoint.get("nodeName")))
    if not found:
        waiting = f" ({len(not_ready)} not ready: {', '.join(not_ready)})" if not_ready else ""
        raise ProbeError(
            f"Service {service} has no ready endpoints{waiting}: no engine serves it now; "
            "`kubectl get pods` and `kubectl describe pod` say why its pods are not ready"
        )
    return list(found.values())


def _port_of(item: Mapping[str, Any], *, service: str, wanted: str | None) -> int:
    """The number of the slice's port named ``wanted`` (unset: its only port); slices of
    one Service may differ (a named targetPort resolves per pod)."""
    ports = item.get("ports") or []
    names = ", ".join(repr(p.get("name") or "") for p in ports) or "none"
    if wanted is None:
        if len(ports) == 1:
            return int(ports[0]["port"])
        raise ProbeError(
            f"Service {service} has {len(ports)} ports ({names}): set kubernetes_port to the "
            "name of the one vLLM serves on"
        )
    for p in ports:
        if p.get("name") == wanted:
            return int(p["port"])
    raise ProbeError(
        f"Service {service} has no port named {wanted!r} (its ports: {names}): fix kubernetes_port"
    )


def _host(address: str) -> str:
    """An address as a URL's host: IPv6 in brackets."""
    return f"[{address}]" if ":" in address else address
