"""The engines that serve a target: its replicas, each scraped on its own (docs/fleet.md).

Today a target lists them (``replicas`` in its config), or is the one engine at ``vllm_url``.
Other ways to find them (a Kubernetes Service's EndpointSlices, a Prometheus's targets) belong
here as further sources of the same list.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from bot.config import Target


@dataclass(frozen=True)
class Replica:
    """One engine of a target, by its base URL."""

    url: str

    @property
    def metrics_url(self) -> str:
        """Its /metrics page."""
        return f"{self.url}/metrics"

    @property
    def address(self) -> str:
        """host:port and path, never user info: how details and merged pages name it."""
        parts = urlsplit(self.url)
        return parts.netloc.rpartition("@")[2] + parts.path


def replicas_of(target: Target) -> list[Replica]:
    """The target's replicas: those it lists, else the one engine at its vllm_url."""
    return [Replica(url) for url in target.replicas] or [Replica(target.vllm_url)]
