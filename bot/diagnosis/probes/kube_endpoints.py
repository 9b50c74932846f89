"""A target's replicas from the Kubernetes API: the ready endpoints of a Service.

    GET /apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices
        ?labelSelector=kubernetes.io/service-name={name}

The Service's EndpointSlices list every pod behind it, one address each (a pod's IP), with the
Service's ports. An endpoint whose ``conditions.ready`` is false is left out (the API says an
unset ``ready`` means ready): the Service sends it no traffic, so its numbers are not the
target's. Each ready address with the chosen port is one replica, with its pod and node.

Every failure (API unreachable, 401/403, no slice, no ready endpoint, no such port) is a
ProbeError that says what to do: an empty fleet would read as a target that served nothing.

The API is read with the client the Kubernetes actuator uses (bot.kernel.runtime.kube_client): a
bearer token read from its file on every request and the cluster's CA.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from bot.diagnosis.probes.replicas import Replica
from bot.kernel import POD_NETWORKS, KubernetesApiSpec, ProbeError
from bot.kernel.runtime import kube_client

SERVICE_LABEL = "kubernetes.io/service-name"
_FAMILIES = ("IPv4", "IPv6")  # an FQDN slice names hosts the bot would resolve: never read
RBAC_HINT = (
    "grant the bot's service account get and list on endpointslices (apiGroup "
    "discovery.k8s.io) in namespace {ns}: a rule in its Role (deploy/kubernetes/base/rbac.yaml)"
)


def api_client(
    api: KubernetesApiSpec, *, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """A client of the API (bot.kernel.runtime.kube_client) whose token and CA failures are
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
    networks: Sequence[str] = POD_NETWORKS,
    max_replicas: int = 64,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[Replica]:
    """The ready endpoints of Service ``service`` (namespace/name) as replicas, each address
    checked against ``networks`` and their number against ``max_replicas``."""
    namespace, _, name = service.partition("/")
    async with api_client(api, transport=transport) as http:
        slices = await _list_slices(http, namespace, name)
    return replicas_in(
        slices, service=service, port=port, networks=networks, max_replicas=max_replicas
    )


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


def replicas_in(
    slices: Sequence[Any],
    *,
    service: str,
    port: str | None,
    networks: Sequence[str] = POD_NETWORKS,
    max_replicas: int = 64,
) -> list[Replica]:
    """The replicas the slices list: each ready address on the port named ``port`` (unset:
    the Service's only port), in the API's order, each once. Every address is checked before
    it becomes a URL the bot will fetch (``checked_host``): an IP of the slice's own family,
    in one of ``networks``; anything else refuses the whole discovery (ProbeError), so no
    address of the API's choosing is ever scraped and the thread says nothing of it."""
    if not slices:
        raise ProbeError(
            f"Service {service} has no EndpointSlices: check that the Service exists and has a "
            "selector (the EndpointSlice controller makes slices only for those), or fix "
            "kubernetes_service"
        )
    allowed = [ipaddress.ip_network(n) for n in networks]
    found: dict[str, Replica] = {}
    not_ready: list[str] = []
    refused: list[str] = []
    for item in slices:
        if not isinstance(item, Mapping):
            raise ProbeError(f"Service {service}: an EndpointSlice is not an object")
        family = item.get("addressType")
        endpoints = _list_of(item.get("endpoints"), "endpoints", service)
        if endpoints and family not in _FAMILIES:
            refused.append(f"a slice of addressType {_said(family)} (only IPv4 and IPv6 are read)")
            continue
        for endpoint in endpoints:
            replica = _replica(endpoint, item, service=service, port=port, allowed=allowed)
            if isinstance(replica, Replica):
                found.setdefault(replica.url, replica)
            elif replica.startswith(_NOT_READY):
                not_ready.append(replica.removeprefix(_NOT_READY))
            else:
                refused.append(replica)
            if len(found) > max_replicas:
                raise ProbeError(
                    f"Service {service} lists more than {max_replicas} ready endpoints: "
                    "nothing was scraped; raise kubernetes_max_replicas if the fleet is "
                    "really that large"
                )
    if refused:
        more = f"; and {len(refused) - 3} more" if len(refused) > 3 else ""
        shown = "; ".join(refused[:3]) + more
        raise ProbeError(
            f"Service {service}: {len(refused)} endpoint address(es) refused, nothing was "
            f"scraped: {shown}. A pod's address must be an IP in kubernetes_networks "
            f"({', '.join(networks)}); add the cluster's pod network there if it is another"
        )
    if not found:
        waiting = f" ({len(not_ready)} not ready: {', '.join(not_ready)})" if not_ready else ""
        raise ProbeError(
            f"Service {service} has no ready endpoints{waiting}: no engine serves it now; "
            "`kubectl get pods` and `kubectl describe pod` say why its pods are not ready"
        )
    return list(found.values())


_NOT_READY = "not ready: "
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _replica(
    endpoint: object,
    item: Mapping[str, Any],
    *,
    service: str,
    port: str | None,
    allowed: Sequence[_Network],
) -> Replica | str:
    """One endpoint as a replica; else why not (``_NOT_READY`` and its pod, or why refused)."""
    if not isinstance(endpoint, Mapping):
        raise ProbeError(f"Service {service}: an endpoint of an EndpointSlice is not an object")
    ref = endpoint.get("targetRef") or {}
    pod = ref.get("name") if isinstance(ref, Mapping) and ref.get("kind") == "Pod" else None
    pod = pod if isinstance(pod, str) else None
    addresses = _list_of(endpoint.get("addresses"), "addresses", service)
    conditions = endpoint.get("conditions") or {}
    if isinstance(conditions, Mapping) and conditions.get("ready") is False:
        return _NOT_READY + (pod or f"{len(addresses)} address(es)")
    number = _port_of(item, service=service, wanted=port)
    if not addresses:
        return "an endpoint without an address"
    # the API holds exactly one address per endpoint
    host, why = checked_host(addresses[0], family=str(item.get("addressType")), allowed=allowed)
    if host is None:
        return why
    node = endpoint.get("nodeName")
    return Replica(f"http://{host}:{number}", pod=pod, node=node if isinstance(node, str) else None)


def _list_of(value: object, field: str, service: str) -> list[Any]:
    """A slice's list field (null: empty); anything else is a ProbeError, not a traceback."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ProbeError(f"Service {service}: an EndpointSlice's `{field}` is not a list")
    return value


def _said(value: object) -> str:
    """A value from the API, short and printable, for an error message."""
    text = value if isinstance(value, str) else type(value).__name__
    return repr(text[:40] + ("…" if len(text) > 40 else ""))


# the addresses never scraped unless a listed network lies inside their block
_SPECIAL = ("is_loopback", "is_link_local", "is_multicast", "is_unspecified", "is_reserved")


def checked_host(
    address: object, *, family: str, allowed: Sequence[_Network]
) -> tuple[str | None, str]:
    """The address as a URL's host (IPv6 in brackets) when it may be scraped, else None and
    why. It must be an IP of the slice's family in an allowed network; a loopback, link-local
    (169.254.169.254, the cloud metadata service), multicast, unspecified or reserved one only
    when an allowed network is itself inside that kind of block (listed on purpose)."""
    try:
        ip = ipaddress.ip_address(address) if isinstance(address, str) else None
    except ValueError:
        ip = None
    if ip is None or f"IPv{ip.version}" != family:
        return None, f"{_said(address)} is not an {family} address"
    ip = getattr(ip, "ipv4_mapped", None) or ip
    inside = [n for n in allowed if n.version == ip.version and ip in n]
    special = [kind for kind in _SPECIAL if getattr(ip, kind)]
    if special and not any(all(getattr(n, kind) for kind in special) for n in inside):
        return None, f"{ip} is a {special[0].removeprefix('is_').replace('_', '-')} address"
    if not inside:
        return None, f"{ip} is outside kubernetes_networks"
    return (f"[{ip}]" if ip.version == 6 else str(ip)), ""


def _port_of(item: Mapping[str, Any], *, service: str, wanted: str | None) -> int:
    """The number of the slice's port named ``wanted`` (unset: its only port); slices of
    one Service may differ (a named targetPort resolves per pod)."""
    ports = [p for p in _list_of(item.get("ports"), "ports", service) if isinstance(p, Mapping)]
    names = ", ".join(_said(p.get("name") or "") for p in ports) or "none"
    if wanted is None:
        if len(ports) == 1:
            return _port_number(ports[0], service)
        raise ProbeError(
            f"Service {service} has {len(ports)} ports ({names}): set kubernetes_port to the "
            "name of the one vLLM serves on"
        )
    for p in ports:
        if p.get("name") == wanted:
            return _port_number(p, service)
    raise ProbeError(
        f"Service {service} has no port named {wanted!r} (its ports: {names}): fix kubernetes_port"
    )


def _port_number(port: Mapping[str, Any], service: str) -> int:
    """A TCP port's number, 1-65535; anything else is a ProbeError."""
    number, protocol = port.get("port"), port.get("protocol", "TCP")
    if type(number) is not int or not 1 <= number <= 65535 or protocol not in ("TCP", None):
        raise ProbeError(
            f"Service {service}: port {_said(port.get('name') or '')} is not a TCP port number "
            f"1-65535 (port {_said(number) if not isinstance(number, int) else number}, "
            f"protocol {_said(protocol)})"
        )
    return number
