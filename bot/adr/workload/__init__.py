"""Workload shapes: what the traffic on an engine looks like, stored as a small versioned file
(``shape``), compared (``diff``) to say when production drifted from the shape a decision was
measured under, and put in words (``describe``) (docs/workload.md).

A shape is captured in bot/diagnosis/probes/ (``workload_capture`` from the engines' own /metrics,
``prometheus_capture`` from Prometheus, ``gateway_capture`` from the gateway's records): capture
scrapes and windows /metrics the way the probes do, and this package sits below them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.adr.workload.describe import PREFIX as PREFIX
    from bot.adr.workload.describe import context_line as context_line
    from bot.adr.workload.diff import ShapeDiff as ShapeDiff
    from bot.adr.workload.shape import Arrivals as Arrivals
    from bot.adr.workload.shape import Lengths as Lengths
    from bot.adr.workload.shape import Prefix as Prefix
    from bot.adr.workload.shape import PrefixGroup as PrefixGroup
    from bot.adr.workload.shape import RatePer as RatePer
    from bot.adr.workload.shape import WorkloadShape as WorkloadShape
    from bot.adr.workload.shape import edge_text as edge_text
    from bot.adr.workload.shape import load as load
    from bot.adr.workload.shape import new_shape as new_shape
    from bot.adr.workload.shape import parse_edge as parse_edge
    from bot.adr.workload.shape import per_replica as per_replica

__all__ = [
    "Arrivals",
    "Lengths",
    "PREFIX",
    "Prefix",
    "PrefixGroup",
    "RatePer",
    "ShapeDiff",
    "WorkloadShape",
    "context_line",
    "diff",
    "edge_text",
    "load",
    "new_shape",
    "parse_edge",
    "per_replica",
    "shape",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
