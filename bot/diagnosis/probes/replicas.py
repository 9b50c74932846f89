"""The engines that serve a target: its replicas, each scraped on its own (docs/fleet.md).

Exactly one source names them, in this order (``source_of``): the URLs a target lists
(``replicas``, or its two pools ``prefill_replicas`` and ``decode_replicas``), else the ready
endpoints of its ``kubernetes_service`` (discovered when a window
starts: bot/diagnosis/probes/kube_endpoints.py), else the workers of the vllm-router at its
``router_url`` (bot/diagnosis/probes/router_workers.py), else the one engine at ``vllm_url``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from bot.kernel import Target

Pool = Literal["prefill", "decode"]
POOLS: tuple[Pool, ...] = ("prefill", "decode")


@dataclass(frozen=True)
class Replica:
    """One engine of a target, by its base URL (and its pod and node, when discovered)."""

    url: str
    pod: str | None = None  # the Kubernetes pod that serves it (an EndpointSlice's targetRef)
    node: str | None = None  # the node that pod runs on (the endpoint's nodeName)
    pool: Pool | None = None  # prefill/decode disaggregation: the pool it serves in

    @property
    def metrics_url(self) -> str:
        """Its /metrics page."""
        return f"{self.url}/metrics"

    @property
    def address(self) -> str:
        """host:port and path, never user info: how details and merged pages name it."""
        parts = urlsplit(self.url)
        return parts.netloc.rpartition("@")[2] + parts.path


Source = Literal[
    "replicas", "pools", "kubernetes_service", "inference_pool", "router_url", "vllm_url"
]


def source_of(target: Target) -> Source:
    """Which of the target's settings names its replicas: the first one set wins."""
    if target.replicas:
        return "replicas"
    if target.prefill_replicas:  # the configuration has refused one pool alone
        return "pools"
    if target.kubernetes_service:
        return "kubernetes_service"
    if target.inference_pool:
        return "inference_pool"
    return "router_url" if target.router_url else "vllm_url"


def replicas_of(target: Target) -> list[Replica]:
    """The target's configured replicas: those it lists (or its prefill pool's, then its
    decode pool's, each tagged with its pool), else the one engine at its vllm_url (a
    kubernetes_service's, an InferencePool's or a router's are discovered instead:
    ``context.resolve_replicas``)."""
    if source_of(target) == "pools":
        return [Replica(url, pool="prefill") for url in target.prefill_replicas] + [
            Replica(url, pool="decode") for url in target.decode_replicas
        ]
    return [Replica(url) for url in target.replicas] or [Replica(target.vllm_url)]
