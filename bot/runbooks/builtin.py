"""The registry a bot starts with: every built-in probe (they live in ``bot.probes``)."""

from __future__ import annotations

from bot.probes.nvml import NvmlProbe
from bot.probes.prometheus import PrometheusProbe
from bot.probes.queue_cancel import QueueCancelProbe
from bot.probes.vllm_window import VllmMetricsProbe
from bot.runbooks.registry import ProbeRegistry


def default_registry() -> ProbeRegistry:
    """A registry with every built-in probe."""
    return ProbeRegistry([VllmMetricsProbe(), NvmlProbe(), QueueCancelProbe(), PrometheusProbe()])
