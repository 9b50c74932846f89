"""Rules conditioned on their workload, on a real vLLM engine (issue 42): two rules for two
workloads, each proven on traffic this engine served (its shape read from the engine's own
/metrics, as the bot records it), and the production diagnosis of each traffic in turn: the rule
whose workload matches is offered, the other is not and the thread's findings say why; a third
workload is answered by neither.

The traffics differ by construction, on a machine of any speed: chats are short random prompts
(nothing for the prefix cache), agents open with the same 1,536-token system prompt (served from
the prefix cache after the first), the third sends 768-token random prompts. The diagnosis window
is sized from the measured time of one agent request, so requests finish inside it anywhere.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
from pathlib import Path

import httpx
import pytest

from bot.adr.parse import parse
from bot.adr.render import render
from bot.adr.store import AdrStore
from bot.adr.workload import WorkloadShape
from bot.canary import CanaryRun, Workload
from bot.diagnosis.models import Diagnosis
from bot.diagnosis.probes.context import ProbeContext, TargetRef
from bot.diagnosis.runbooks.builtin import default_registry
from bot.diagnosis.runbooks.loader import RunbookSet, load_dir
from bot.diagnosis.runbooks.runner import RunbookRunner
from bot.diagnosis.service import Diagnoser
from bot.engine.process import EngineInfo
from bot.eval.run import sized
from bot.kernel.config import Target

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("box_alone")]

ROOT = Path(__file__).parent.parent
ALERT = {"alertname": "VLLMTimeToFirstTokenP99High"}  # the shipped TTFT alert's runbook
SEED = ROOT / "adr" / "ADR-20260831-01-kv-cache-paging-throughput.md"
CHAT_RULE, AGENT_RULE = "ADR-20261205-11", "ADR-20261205-12"
STREAMS = 3
TRAFFIC = {  # name -> (prompt tokens, of them a shared prefix)
    "chats": (128, 0),
    "agents": (1792, 1536),
    "third": (768, 0),
}
FINISHED = 6  # requests the load finishes before the window opens (the cache warm)


def load(info: EngineInfo, name: str) -> CanaryRun:
    prompt, prefix = TRAFFIC[name]
    return CanaryRun(
        Workload(
            endpoint=f"{info.base_url}/v1/completions", concurrency=STREAMS, num_requests=None,
            duration_s=3600, prompt_length=prompt, prefix_length=prefix, output_length=8,
            seed=len(name),
        )
    )  # fmt: skip


async def under(info: EngineInfo, name: str, runbooks: RunbookSet, adrs: Path) -> Diagnosis:
    """The TTFT alert's production diagnosis while ``name``'s traffic runs (warmed up)."""
    run = load(info, name)
    task = asyncio.create_task(run.run())
    try:
        deadline = time.monotonic() + 600
        while sum(r.outcome is not None for r in run.records) < FINISHED:
            assert time.monotonic() < deadline and not task.done(), "the load did not start"
            await asyncio.sleep(0.2)
        return await diagnose(info, runbooks, adrs)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def diagnose(info: EngineInfo, runbooks: RunbookSet, adrs: Path) -> Diagnosis:
    registry = default_registry()
    async with httpx.AsyncClient(timeout=60) as http:
        diagnoser = Diagnoser(
            runbooks=runbooks, runner=RunbookRunner(registry=registry),
            adrs=AdrStore(root=adrs), context=lambda: ProbeContext(http=http),
            clock=lambda: dt.datetime.now(dt.UTC),
        )  # fmt: skip
        return await diagnoser.diagnose(TargetRef("tiny", Target(vllm_url=info.base_url)),
                                        labels=ALERT)  # fmt: skip


def write_rule(adrs: Path, adr_id: str, workload: WorkloadShape | None) -> None:
    """The seed's fix as a rule proven on ``workload``, matching any latency (TTFT > 0), for
    any cause (the workload decides here, not the cause)."""
    seed = parse(SEED.read_text(encoding="utf-8"))
    match = [seed.match[0].model_copy(update={"op": ">", "value": 0.0})]
    rule = seed.model_copy(update={"id": adr_id, "workload": workload, "match": match, "cause": []})
    (adrs / f"{adr_id}-rule.md").write_text(render(rule), encoding="utf-8")


async def agent_request_s(info: EngineInfo) -> float:
    """One agent request alone, end to end (sizes the diagnosis window)."""
    run = CanaryRun(
        Workload(endpoint=f"{info.base_url}/v1/completions", concurrency=1, num_requests=2,
                 prompt_length=TRAFFIC["agents"][0], output_length=8)
    )  # fmt: skip
    await run.run()
    return max(r.e2e_s or 0.0 for r in run.records)


def offered(diagnosis: Diagnosis) -> list[str]:
    return [m.adr.id for m in diagnosis.matches]


def workload_lines(diagnosis: Diagnosis) -> list[str]:
    return [f.message for f in diagnosis.findings if f.source == "adr workload"]


async def test_each_traffic_is_answered_by_the_rule_proven_on_it(
    engine: EngineInfo, tmp_path: Path
) -> None:
    window_s = max(10.0, math.ceil(8 * await agent_request_s(engine)))
    runbooks = sized(load_dir(ROOT / "runbooks", default_registry()), window_s)
    adrs = tmp_path / "adr"
    adrs.mkdir()
    # prove each rule on its traffic: the shape the diagnosis read of it (no rule has one yet)
    write_rule(adrs, CHAT_RULE, None)
    proven = {
        name: (await under(engine, name, runbooks, adrs)).workload for name in ("chats", "agents")
    }
    assert proven["chats"] is not None and proven["agents"] is not None, proven
    write_rule(adrs, CHAT_RULE, proven["chats"])
    write_rule(adrs, AGENT_RULE, proven["agents"])

    chats = await under(engine, "chats", runbooks, adrs)
    agents = await under(engine, "agents", runbooks, adrs)
    third = await under(engine, "third", runbooks, adrs)

    assert offered(chats) == [CHAT_RULE], [f.message for f in chats.findings]
    (why,) = workload_lines(chats)
    assert why.startswith(f"{AGENT_RULE} not offered: proven on another workload (") and (
        "DRIFTED" in why
    )
    assert offered(agents) == [AGENT_RULE], workload_lines(agents)
    assert workload_lines(agents)[0].startswith(f"{CHAT_RULE} not offered")
    assert offered(third) == [], workload_lines(third)
    assert [line.split(" ")[0] for line in workload_lines(third)] == [CHAT_RULE, AGENT_RULE]
    print(f"\nwindow {window_s:.0f} s; chats: {workload_lines(chats)}\nagents: "
          f"{workload_lines(agents)}\nthird: {workload_lines(third)}")  # fmt: skip
