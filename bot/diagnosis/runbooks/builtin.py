"""The registry a bot starts with: every built-in probe (they live in ``bot.diagnosis.probes``)."""

from __future__ import annotations

from bot.diagnosis.probes.nvml import NvmlProbe
from bot.diagnosis.probes.prometheus import PrometheusProbe
from bot.diagnosis.probes.queue_cancel import QueueCancelProbe
from bot.diagnosis.probes.vllm_window import VllmMetricsProbe
from bot.diagnosis.runbooks.registry import ProbeRegistry


def default_registry() -> ProbeRegistry:
    """A registry with every built-in probe."""
    return ProbeRegistry([VllmMetricsProbe(), NvmlProbe(), QueueCancelProbe(), PrometheusProbe()])
