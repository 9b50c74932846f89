"""Probes: read an inference system (vLLM /metrics, NVML, queues) and turn readings into numbers.

The workload capture (``workload_capture``, ``prometheus_capture``, ``gateway_capture``) reads
the same /metrics into a workload shape (bot/adr/workload/)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.diagnosis.probes.context import ProbeContext as ProbeContext
    from bot.diagnosis.probes.context import TargetRef as TargetRef
    from bot.diagnosis.probes.context import resolve_replicas as resolve_replicas
    from bot.diagnosis.probes.engine_identity import IDENTITY_METRICS as IDENTITY_METRICS
    from bot.diagnosis.probes.exposition import Exposition as Exposition
    from bot.diagnosis.probes.fleet_merge import Member as Member
    from bot.diagnosis.probes.fleet_merge import merge_rounds as merge_rounds
    from bot.diagnosis.probes.fleet_window import Answer as Answer
    from bot.diagnosis.probes.fleet_window import FleetWindow as FleetWindow
    from bot.diagnosis.probes.fleet_window import ReplicaWindow as ReplicaWindow
    from bot.diagnosis.probes.fleet_window import fleet_of as fleet_of
    from bot.diagnosis.probes.fragmentation import FragmentationSample as FragmentationSample
    from bot.diagnosis.probes.fragmentation import internal_fragmentation as internal_fragmentation
    from bot.diagnosis.probes.fragmentation import observed_fragmentation as observed_fragmentation
    from bot.diagnosis.probes.fragmentation import resident_lengths as resident_lengths
    from bot.diagnosis.probes.prometheus_capture import parse_since as parse_since
    from bot.diagnosis.probes.replicas import Replica as Replica
    from bot.diagnosis.probes.sampling import TPOT as TPOT
    from bot.diagnosis.probes.sampling import SampledWindow as SampledWindow
    from bot.diagnosis.probes.types import Finding as Finding
    from bot.diagnosis.probes.types import Severity as Severity
    from bot.diagnosis.probes.vllm_metrics import CACHE_CONFIG as CACHE_CONFIG
    from bot.diagnosis.probes.vllm_metrics import GENERATION_TOKENS as GENERATION_TOKENS
    from bot.diagnosis.probes.vllm_metrics import ITL as ITL
    from bot.diagnosis.probes.vllm_metrics import KV_USAGE as KV_USAGE
    from bot.diagnosis.probes.vllm_metrics import REQUEST_SUCCESS as REQUEST_SUCCESS
    from bot.diagnosis.probes.vllm_metrics import RUNNING as RUNNING
    from bot.diagnosis.probes.vllm_metrics import SAMPLE_METRICS as SAMPLE_METRICS
    from bot.diagnosis.probes.vllm_metrics import TTFT as TTFT
    from bot.diagnosis.probes.vllm_metrics import WAITING as WAITING
    from bot.diagnosis.probes.vllm_metrics import WINDOW_METRICS as WINDOW_METRICS
    from bot.diagnosis.probes.vllm_metrics import CacheConfig as CacheConfig
    from bot.diagnosis.probes.vllm_metrics import EngineWindow as EngineWindow
    from bot.diagnosis.probes.vllm_metrics import MetricsScraper as MetricsScraper
    from bot.diagnosis.probes.vllm_metrics import Quantiles as Quantiles
    from bot.diagnosis.probes.vllm_metrics import cache_config as cache_config
    from bot.diagnosis.probes.vllm_metrics import gauge as gauge
    from bot.diagnosis.probes.vllm_metrics import kv_blocks_used as kv_blocks_used
    from bot.diagnosis.probes.vllm_metrics import kv_usage as kv_usage
    from bot.diagnosis.probes.vllm_metrics import parse_page as parse_page
    from bot.diagnosis.probes.vllm_metrics import read_window as read_window
    from bot.diagnosis.probes.vllm_window import VllmMetricsProbe as VllmMetricsProbe
    from bot.diagnosis.probes.vllm_window import WindowParams as WindowParams
    from bot.diagnosis.probes.workload_capture import CAPTURE_METRICS as CAPTURE_METRICS
    from bot.diagnosis.probes.workload_capture import CaptureProgress as CaptureProgress
    from bot.diagnosis.probes.workload_capture import capture_fleet as capture_fleet

__all__ = [
    "Answer",
    "CACHE_CONFIG",
    "CAPTURE_METRICS",
    "CacheConfig",
    "CaptureProgress",
    "EngineWindow",
    "Exposition",
    "Finding",
    "FleetWindow",
    "FragmentationSample",
    "GENERATION_TOKENS",
    "IDENTITY_METRICS",
    "ITL",
    "KV_USAGE",
    "Member",
    "MetricsScraper",
    "ProbeContext",
    "Quantiles",
    "REQUEST_SUCCESS",
    "RUNNING",
    "Replica",
    "ReplicaWindow",
    "SAMPLE_METRICS",
    "SampledWindow",
    "Severity",
    "TPOT",
    "TTFT",
    "TargetRef",
    "VllmMetricsProbe",
    "WAITING",
    "WINDOW_METRICS",
    "WindowParams",
    "cache_config",
    "capture_fleet",
    "fleet_of",
    "gateway_capture",
    "gauge",
    "internal_fragmentation",
    "kv_blocks_used",
    "kv_usage",
    "merge_rounds",
    "observed_fragmentation",
    "parse_page",
    "parse_since",
    "prometheus_capture",
    "read_window",
    "resident_lengths",
    "resolve_replicas",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
