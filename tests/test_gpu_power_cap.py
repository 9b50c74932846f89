"""The NVML and DCGM runbooks agree on a GPU's clock events: the same GPU state (the clock-event
reasons bitmask NVML and DCGM's field 112 both report) gives gpu_fault the same verdict in both.
A GPU at its software power cap (0x4) is a busy GPU at its limit: evidence, no fault; a hardware
slowdown (0x8), software or hardware thermal slowdown (0x20, 0x40) or power brake (0x80) is a
fault. NVML's side is read from a real `ruleloop agent` (its NVML the fake one), DCGM's from a real
Prometheus holding dcgm-exporter's series, each through its own probe and runbook.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.diagnosis.causes import judge
from bot.diagnosis.runbooks.builtin import default_registry
from bot.diagnosis.runbooks.loader import load_file
from bot.kernel.numbers import Measured
from tests.fakes.nvml_agent import running_agent
from tests.fakes.prometheus_history import prometheus_with
from tests.test_agent_dcgm import NO_XID, _needs_prometheus, gpu_fault, history, read
from tests.test_agent_probe import probe, target

ROOT = Path(__file__).parent.parent
H200 = ROOT / "tests" / "fixtures" / "nvml" / "h200-x2.json"
STATES = {
    "clear": (0x0, "ruled_out"),
    "power-cap": (0x4, "ruled_out"),
    "hw-slowdown": (0x8, "supported"),
    "sw-thermal": (0x20, "supported"),
    "hw-thermal-and-cap": (0x44, "supported"),
    "power-brake": (0x80, "supported"),
}


async def nvml_verdict(tmp_path: Path, mask: int) -> tuple[str, dict[str, float | None]]:
    """The nvml runbook's gpu_fault on what a real agent reports for two GPUs: GPU 0's clock
    events ``mask``, GPU 1 idle of them; no XID, no uncorrected ECC error."""
    reading = json.loads(H200.read_text())
    reading["gpus"][0]["clock_event_reasons"] = mask
    reading["gpus"][1]["clock_event_reasons"] = 0
    fixture = tmp_path / "gpus.json"
    fixture.write_text(json.dumps(reading))
    with running_agent(tmp_path, "--fixture", str(fixture)) as agent:
        result = await probe(target(agent.url, agent.token_file))
    r = result.readings.numbers
    loaded = load_file(ROOT / "runbooks" / "vllm-latency.yaml", default_registry())
    readings = Measured.of({f"nvml.{k}": v for k, v in r.items()})
    (verdict,) = [v for v in judge(loaded.runbook, readings) if v.cause == "gpu_fault"]
    return verdict.verdict, r


async def dcgm_verdict(tmp_path: Path, mask: int) -> tuple[str, dict[str, float | None]]:
    """The DCGM runbook's gpu_fault on the engine's two GPUs in the same state (GPU 0's field
    112 ``mask`` for the last 10 minutes, GPU 1's 0; no XID, no uncorrectable ECC error)."""
    changes = {
        **NO_XID,
        ("vllm-0", 0, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"): mask,
        ("vllm-0", 1, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"): 0,
    }
    with prometheus_with(history(changes=changes), tmp_path / "prometheus") as url:
        r = await read(url)
    return gpu_fault(r).verdict, r


@pytest.mark.parametrize(("mask", "verdict"), list(STATES.values()), ids=list(STATES))
async def test_both_runbooks_give_the_same_gpu_fault_verdict(
    tmp_path: Path, mask: int, verdict: str
) -> None:
    _needs_prometheus()
    nvml, nvml_readings = await nvml_verdict(tmp_path, mask)
    dcgm, _ = await dcgm_verdict(tmp_path, mask)
    assert (nvml, dcgm) == (verdict, verdict), nvml_readings
    capped = 1 if mask & 0x4 else 0
    assert nvml_readings["power_capped_gpus"] == capped
    assert nvml_readings["slowdown_gpus"] == (1 if mask & 0xE8 else 0)
