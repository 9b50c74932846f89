"""The NVML probe: memory, utilisation, temperature, power, clocks, throttling, ECC/XID, processes.

Where the reading comes from, in this order:

- the target's ``gpu_agent_url``: a `ruleloop agent` beside the engine (Kubernetes: a sidecar or
  a DaemonSet on the GPU node), read over HTTP with the token in ``gpu_agent_token_file``;
- the target's ``gpu_agent_daemonset``: the agent on each replica's node, found through the
  Kubernetes API (bot/diagnosis/probes/gpu_agents.py), every node's GPUs read together and
  each node's own readings in ``details["nodes"]`` (the slow replica's, judged on its own:
  bot/diagnosis/replica_gpus.py);
- in-process: NVML of the host the bot runs on (single-host installs; the demo);
- none: the target names another ``node`` and no agent, so nothing here can read its GPUs.

Every result says which, as its first finding and as ``details["source"]``. The NVML module
(``pynvml`` from nvidia-ml-py) is a parameter: tests hand in a fake with the same functions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from pydantic import Field

from bot.agent import (
    AgentError,
    NvmlUnavailable,
    fetch_snapshot,
    import_pynvml,
    read_once,
    read_token_file,
)
from bot.diagnosis.probes.context import ProbeContext, TargetRef
from bot.diagnosis.probes.gpu_agents import agents_on_nodes
from bot.diagnosis.probes.types import Finding, Params, ProbeResult, Severity
from bot.kernel.numbers import Measured
from bot.kernel.runtime.redact import redact

READINGS = {
    "gpu_count": "GPUs visible to NVML",
    "memory_used_ratio": "highest share of GPU memory in use",
    "utilization_pct": "highest GPU utilisation (%)",
    "temperature_c": "hottest GPU (°C)",
    "power_limit_ratio": "highest power draw / enforced limit",
    "sm_clock_ratio": "lowest SM clock / its maximum",
    "throttled_gpus": "GPUs held back by power or thermal limits",
    "slowdown_gpus": "GPUs with a hardware slowdown, thermal or power-brake clock event",
    "power_capped_gpus": "GPUs at their software power cap (evidence, no fault)",
    "ecc_uncorrected": "volatile uncorrected ECC errors, all GPUs",
    "xid_errors": "XID errors the agent saw since it started, all GPUs (agent only)",
}
# Clock-event reason bits (nvmlClocksEventReason*), as the DCGM runbook reads the same field: a
# hardware slowdown (0x8), software thermal (0x20), hardware thermal (0x40) or power brake (0x80)
# is a fault of the GPU; the software power cap (0x4) is a busy GPU at its power limit, no fault.
SLOWDOWN_MASK = 0x8 | 0x20 | 0x40 | 0x80
POWER_CAP_MASK = 0x4
# XIDs that mean the GPU or its memory is failing, not the application (NVIDIA's XID catalogue).
FATAL_XIDS = {48: "double-bit ECC", 74: "NVLink error", 79: "GPU fell off the bus",
              94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP timeout",
              120: "GSP error"}  # fmt: skip


class NvmlParams(Params):
    """How many processes per GPU to list; how long to wait for a GPU agent."""

    max_processes: int = Field(default=5, ge=0, le=100)
    agent_timeout_s: float = Field(default=5.0, gt=0, le=60)


class NvmlProbe:
    """Reads every GPU of the target: through its agent, or this host's NVML."""

    name: ClassVar[str] = "nvml"
    params_model: ClassVar[type[Params]] = NvmlParams

    def readings(self, params: Params) -> Mapping[str, str]:
        """Always the same readings."""
        return READINGS

    async def run(self, *, target: TargetRef, params: Params, ctx: ProbeContext) -> ProbeResult:
        """Read the agent when the target names one, else NVML here (in a worker thread)."""
        assert isinstance(params, NvmlParams)
        spec = target.target
        if spec.gpu_agent_url:
            return await self._from_agent(spec.gpu_agent_url, target, params, ctx)
        if spec.gpu_agent_daemonset:
            return await self._from_daemonset(spec.gpu_agent_daemonset, target, params, ctx)
        if spec.node and spec.node != ctx.hostname:
            message = (
                f"no GPU reading: NVML in-process reads only this host ({ctx.hostname}) and "
                f"{target.name} runs on {spec.node}; set gpu_agent_url to a `ruleloop agent` "
                "there (or gpu_agent_daemonset to its DaemonSet), or read its DCGM exporter "
                "(runbook vllm-latency-dcgm)"
            )
            return ProbeResult(
                findings=[Finding(Severity.INFO, message, self.name)],
                details={"source": {"kind": "none", "where": None}},
            )
        return await self._in_process(params, ctx)

    async def _in_process(self, params: NvmlParams, ctx: ProbeContext) -> ProbeResult:
        where = f"in-process on {ctx.hostname}"
        source = {"kind": "in-process", "where": ctx.hostname}
        nvml = ctx.nvml if ctx.nvml is not None else import_pynvml()
        if nvml is None:
            return _no_gpu(where, "nvidia-ml-py is not installed", source, Severity.INFO)
        try:
            snapshot = await asyncio.to_thread(read_once, nvml, max_processes=params.max_processes)
        except NvmlUnavailable as exc:
            if exc.code == "nvml_unavailable":
                return _no_gpu(where, str(exc), source, Severity.INFO)
            return _failed(f"GPU reading {where} failed: {exc}", source)
        return summarize(snapshot, source=source, where=where)

    async def _from_daemonset(
        self, daemonset: str, target: TargetRef, params: NvmlParams, ctx: ProbeContext
    ) -> ProbeResult:
        """The agent on each replica's node (bot/diagnosis/probes/gpu_agents.py), every GPU
        read together; each node's own readings in ``details["nodes"]``."""
        spec = target.target
        replicas = await ctx.replicas(spec)
        nodes = list(dict.fromkeys(r.node for r in replicas if r.node)) or (
            [spec.node] if spec.node else []
        )
        source = {"kind": "daemonset", "where": daemonset}
        if not nodes:
            message = (
                f"no GPU reading: gpu_agent_daemonset reads the agent on each replica's node, "
                f"and no node of {target.name}'s replicas is known; name them by "
                "kubernetes_service or inference_pool (their pods' nodes are discovered), or "
                "set node for one engine"
            )
            return _failed(message, source)
        agents = await agents_on_nodes(
            daemonset, nodes, api=spec.kubernetes_api, port=spec.gpu_agent_port,
            networks=spec.kubernetes_networks,
        )  # fmt: skip
        try:
            token = read_token_file(spec.gpu_agent_token_file)
        except AgentError as exc:
            return _failed(f"GPU reading failed: {exc}", source)
        read = await asyncio.gather(
            *(self._snapshot(url, token, params, ctx) for url in agents.urls.values())
        )
        return merged(dict(zip(agents.urls, read, strict=True)), agents.missing, source)

    async def _snapshot(
        self, url: str, token: str | None, params: NvmlParams, ctx: ProbeContext
    ) -> Mapping[str, Any] | str:
        """One agent's snapshot, or why it could not be read."""
        try:
            return await fetch_snapshot(
                ctx.http, url, token=token, max_processes=params.max_processes,
                timeout_s=params.agent_timeout_s,
            )  # fmt: skip
        except AgentError as exc:
            return str(exc)

    async def _from_agent(
        self, url: str, target: TargetRef, params: NvmlParams, ctx: ProbeContext
    ) -> ProbeResult:
        shown = redact(url)  # what the texts name
        source = {"kind": "agent", "where": shown}
        try:
            token = read_token_file(target.target.gpu_agent_token_file)
            snapshot = await fetch_snapshot(
                ctx.http, url, token=token, max_processes=params.max_processes,
                timeout_s=params.agent_timeout_s,
            )  # fmt: skip
        except AgentError as exc:
            if exc.no_gpu:
                return _no_gpu(f"from the agent at {shown}", str(exc), source, Severity.WARNING)
            return _failed(f"GPU reading failed: {exc}", source)
        where = f"from the agent at {shown} (host {snapshot.get('host') or '?'})"
        return summarize(snapshot, source=source, where=where)


def _no_gpu(
    where: str, why: str, source: dict[str, Any], severity: Severity
) -> ProbeResult:  # fmt: skip
    message = f"no GPU visible to NVML {where} ({why})"
    return ProbeResult(
        readings=Measured.of({"gpu_count": 0.0}),
        findings=[Finding(severity, message, NvmlProbe.name)],
        details={"source": source},
    )


def _failed(message: str, source: dict[str, Any]) -> ProbeResult:
    return ProbeResult(
        findings=[Finding(Severity.WARNING, message, NvmlProbe.name)], details={"source": source}
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _extreme(pick: Callable[..., float], values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(pick(present)) if present else None


def _with_bits(gpus: Sequence[Mapping[str, Any]], bits: int) -> float | None:
    """How many GPUs have any of ``bits`` in their clock-event reasons (None: no GPU's known)."""
    masks = [
        g["clock_event_reasons_mask"] for g in gpus if g.get("clock_event_reasons_mask") is not None
    ]
    return float(sum(1 for m in masks if m & bits)) if masks else None


def _gpu_findings(gpu: dict[str, Any]) -> list[Finding]:
    """Throttling, ECC errors and XIDs of one GPU."""
    found = []
    i = gpu.get("index", "?")
    if gpu.get("throttle_reasons"):
        why = ", ".join(gpu["throttle_reasons"])
        mask = gpu.get("clock_event_reasons_mask")
        capped = mask is not None and not mask & SLOWDOWN_MASK  # the power cap alone: no fault
        severity = Severity.INFO if capped else Severity.WARNING
        found.append(Finding(severity, f"GPU {i} is throttled: {why}", NvmlProbe.name))
    if gpu.get("ecc_uncorrected"):
        found.append(Finding(
            Severity.CRITICAL,
            f"GPU {i} has {gpu['ecc_uncorrected']} uncorrected ECC errors since boot: "
            "drain the node",
            NvmlProbe.name,
            float(gpu["ecc_uncorrected"]),
        ))  # fmt: skip
    xid = gpu.get("xid") or {}
    if xid.get("count"):
        codes = sorted({e["xid"] for e in xid.get("recent", [])})
        fatal = [f"{c} ({FATAL_XIDS[c]})" for c in codes if c in FATAL_XIDS]
        severity = Severity.CRITICAL if fatal else Severity.WARNING
        shown = ", ".join(fatal or [str(c) for c in codes])
        found.append(Finding(
            severity,
            f"GPU {i} raised {xid['count']} XID error(s) since {xid.get('since', '?')}: XID "
            f"{shown}" + ("; drain the node" if fatal else ""),
            NvmlProbe.name,
            float(xid["count"]),
        ))  # fmt: skip
    return found


def summarize(snapshot: dict[str, Any], *, source: dict[str, Any], where: str) -> ProbeResult:
    """Readings across GPUs (worst GPU counts); the source first, then per-GPU findings."""
    gpus: list[dict[str, Any]] = snapshot["gpus"]
    if not gpus:
        severity = Severity.INFO if source["kind"] == "in-process" else Severity.WARNING
        return _no_gpu(where, "the driver lists no devices", source, severity)
    driver = snapshot.get("driver")
    findings = [
        Finding(
            Severity.INFO,
            f"GPU reading {where}: {len(gpus)} GPU(s){f', driver {driver}' if driver else ''}",
            NvmlProbe.name,
        )
    ]
    for gpu in gpus:
        findings += _gpu_findings(gpu)
    ecc = [g["ecc_uncorrected"] for g in gpus if g.get("ecc_uncorrected") is not None]
    xids = [g["xid"]["count"] for g in gpus if (g.get("xid") or {}).get("watching")]
    readings = {
        "gpu_count": float(len(gpus)),
        "memory_used_ratio": _extreme(
            max, [_ratio(g.get("memory_used_bytes"), g.get("memory_total_bytes")) for g in gpus]
        ),
        "utilization_pct": _extreme(max, [g.get("utilization_pct") for g in gpus]),
        "temperature_c": _extreme(max, [g.get("temperature_c") for g in gpus]),
        "power_limit_ratio": _extreme(
            max, [_ratio(g.get("power_w"), g.get("power_limit_w")) for g in gpus]
        ),
        "sm_clock_ratio": _extreme(
            min, [_ratio(g.get("sm_clock_mhz"), g.get("sm_clock_max_mhz")) for g in gpus]
        ),
        "throttled_gpus": float(sum(1 for g in gpus if g.get("throttle_reasons"))),
        "slowdown_gpus": _with_bits(gpus, SLOWDOWN_MASK),
        "power_capped_gpus": _with_bits(gpus, POWER_CAP_MASK),
        "ecc_uncorrected": float(sum(ecc)) if ecc else None,
        "xid_errors": float(sum(xids)) if xids else None,
    }
    details = {"source": source, "host": snapshot.get("host"), "driver": driver, "gpus": gpus}
    return ProbeResult(readings=Measured.of(readings), findings=findings, details=details)


# The readings that rule a GPU fault out: with a node unread, a 0 cannot speak for its GPUs.
CLEAR_ONLY_IF_ALL = ("xid_errors", "ecc_uncorrected", "slowdown_gpus", "throttled_gpus")


def merged(
    snapshots: Mapping[str, Mapping[str, Any] | str],
    missing: Mapping[str, str],
    source: Mapping[str, Any],
) -> ProbeResult:
    """Every node's GPUs read together (the worst GPU counts), each node's readings in
    ``details["nodes"]``; a node not read is a warning, and with one, no fault reads clear."""
    unread = {**missing, **{n: s for n, s in snapshots.items() if isinstance(s, str)}}
    read = {n: s for n, s in snapshots.items() if not isinstance(s, str)}
    findings = [
        Finding(Severity.WARNING, f"no GPU reading of node {node}: {why}", NvmlProbe.name)
        for node, why in unread.items()
    ]
    if not read:
        return ProbeResult(findings=findings, details={"source": dict(source)})
    gpus = [{**g, "index": f"{g.get('index', '?')} on node {node}"}
            for node, snapshot in read.items() for g in snapshot["gpus"]]  # fmt: skip
    drivers = sorted({str(s.get("driver")) for s in read.values() if s.get("driver")})
    where = f"from the agents of DaemonSet {source['where']} on {len(read)} node(s)"
    result = summarize({"gpus": gpus, "driver": ", ".join(drivers) or None},
                       source=dict(source), where=where)  # fmt: skip
    numbers = dict(result.readings.numbers)
    if unread:
        numbers |= {k: None for k in CLEAR_ONLY_IF_ALL if numbers.get(k) == 0}
    nodes = {
        n: summarize(dict(s), source=dict(source), where=n).readings.numbers
        for n, s in read.items()
    }
    return ProbeResult(
        readings=Measured.of(numbers),
        findings=[*result.findings, *findings],
        details={**result.details, "nodes": nodes},
    )
