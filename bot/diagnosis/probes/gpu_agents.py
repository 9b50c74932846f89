"""The `ruleloop agent` on each replica's node: a target's ``gpu_agent_daemonset`` (namespace/name).

    GET /apis/apps/v1/namespaces/{ns}/daemonsets/{name}      spec.selector.matchLabels, its uid
    GET /api/v1/namespaces/{ns}/pods?labelSelector=k=v,...     the DaemonSet's pods

A node's agent is the pod on it (``spec.nodeName``) that the DaemonSet controls (an
``ownerReferences`` entry with its uid and ``controller: true``: a pod that only shares its labels
is not it), Ready and not being deleted. Its pod IP is checked as a discovered replica's address
is (``kube_endpoints.checked_host``: an IP inside kubernetes_networks; a refused one refuses the
whole discovery) and the agent is read at ``http://<pod IP>:<gpu_agent_port>``. A node without
such a pod is said, with what to look at; API failures are ProbeErrors that say what to do.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from bot.diagnosis.probes.inference_pool import get_object, part, pod_ready
from bot.diagnosis.probes.kube_endpoints import api_client, checked_host
from bot.kernel import POD_NETWORKS, KubernetesApiSpec, ProbeError

RBAC_HINT = (
    "grant the bot's service account get on daemonsets (apiGroup apps) and list on pods in "
    "namespace {ns} (deploy/kubernetes/components/nvml-agent/rbac.yaml)"
)


@dataclass(frozen=True)
class NodeAgents:
    """The agent's URL on each node that has one, and why not on each node that has none."""

    urls: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)


async def agents_on_nodes(
    daemonset: str,
    nodes: Collection[str],
    *,
    api: KubernetesApiSpec,
    port: int,
    networks: Sequence[str] = POD_NETWORKS,
    transport: httpx.AsyncBaseTransport | None = None,
) -> NodeAgents:
    """The agent of DaemonSet ``daemonset`` on each of ``nodes``."""
    namespace, _, name = daemonset.partition("/")
    what = f"DaemonSet {daemonset}"
    async with api_client(api, transport=transport) as http:
        found = await get_object(http, f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}",
                                 what=what, namespace=namespace, missing_ok=True,
                                 rbac_hint=RBAC_HINT)  # fmt: skip
        if not found:
            raise ProbeError(
                f"{what} not found: check `kubectl -n {namespace} get daemonsets` and fix the "
                "target's gpu_agent_daemonset"
            )
        labels = _match_labels(found, what)
        pods = await get_object(http, f"/api/v1/namespaces/{namespace}/pods",
                                what=f"the pods of {what}", namespace=namespace,
                                params={"labelSelector": labels}, rbac_hint=RBAC_HINT)  # fmt: skip
    uid = part(found, "metadata").get("uid")
    return agents_of_pods(pods.get("items"), nodes, daemonset=daemonset, uid=uid, port=port,
                          networks=networks)  # fmt: skip


def _match_labels(daemonset: Mapping[str, Any], what: str) -> str:
    """The DaemonSet's selector as an equality label selector."""
    labels = part(part(daemonset, "spec"), "selector").get("matchLabels")
    if (
        not isinstance(labels, Mapping)
        or not labels
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
    ):
        raise ProbeError(f"{what}: its spec.selector has no matchLabels to find its pods by")
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def agents_of_pods(
    items: object,
    nodes: Collection[str],
    *,
    daemonset: str,
    uid: object,
    port: int,
    networks: Sequence[str] = POD_NETWORKS,
) -> NodeAgents:
    """Each node's Ready agent pod that the DaemonSet controls, as the agent's URL."""
    if not isinstance(items, list):
        raise ProbeError(f"DaemonSet {daemonset}: the pods list has no `items` list")
    allowed = [ipaddress.ip_network(n) for n in networks]
    agents = NodeAgents()
    for pod in items:
        node = part(pod, "spec").get("nodeName")
        meta, status = part(pod, "metadata"), part(pod, "status")
        if not isinstance(node, str) or node not in nodes or node in agents.urls:
            continue
        if not _controlled(meta, uid):
            continue
        if meta.get("deletionTimestamp") or not pod_ready(status):
            agents.missing[node] = f"its agent pod {meta.get('name')} is not Ready"
            continue
        address = status.get("podIP")
        family = f"IPv{6 if isinstance(address, str) and ':' in address else 4}"
        host, why = checked_host(address, family=family, allowed=allowed)
        if host is None:
            raise ProbeError(
                f"DaemonSet {daemonset}: the address of agent pod {meta.get('name')} on node "
                f"{node} was refused, no agent was read: {why}. An agent pod's address must be "
                f"an IP in kubernetes_networks ({', '.join(networks)})"
            )
        agents.urls[node] = f"http://{host}:{port}"
        agents.missing.pop(node, None)
    for node in nodes:
        if node not in agents.urls and node not in agents.missing:
            agents.missing[node] = (
                f"DaemonSet {daemonset} has no pod there: check its nodeSelector and tolerations "
                "(`kubectl get pods -o wide` in its namespace)"
            )
    return agents


def _controlled(meta: Mapping[str, Any], uid: object) -> bool:
    """The pod's controller is the DaemonSet (by uid): not a pod that only shares its labels."""
    owners = meta.get("ownerReferences")
    return isinstance(owners, list) and any(
        isinstance(o, Mapping) and o.get("kind") == "DaemonSet" and o.get("uid") == uid
        and o.get("controller") is True
        for o in owners
    )  # fmt: skip
