"""A re-tune on a real vLLM engine (issue 42 item 2): a rule whose fix no longer serves the live
traffic, and the search that finds flags that do, through the local actuator (each trial a
restart of the engine with its flags, the flags found at the start restored after each).

The physics, on a machine of any speed: the rule's fix allows two sequences at once
(``--max-num-seqs 2``); production now sends eight streams at once of chats with long answers
(128 tokens). With two slots six requests wait for a whole answer or more before their first
token; with sixteen none waits, and a first token takes a prefill (a 128-token prompt: a small
fraction of a 128-token answer). The gate is TTFT p99 at most one whole request's time alone
(measured here first): queued requests miss it by about three answers, unqueued ones meet it by
several prefills, so two CPU hogs or a CPU quota move both sides alike. The
search tries the fix's value at a quarter, half, as set and twice, and the value it replaced (16).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from bot.canary.runner import CanaryRun
from bot.canary.shape_replay import fixed_shape
from bot.canary.workload import Workload
from bot.engine.process import EngineManager
from bot.kernel.store import AdrDraft, TuneSession
from bot.kernel.store import service as store
from bot.tune import Offer
from tests.fakes.bot import harness
from tests.fakes.slack_api import FakeSlack
from tests.test_remediation_engine import engine_flags, own_engine

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("box_alone")]

ADR_ID = "ADR-20260831-01"
LAUNCH = ["--enforce-eager", "--max-num-seqs", "2"]  # what serves now: the rule's fix
STREAMS, OUTPUT = 8, 128  # long answers: a queued request waits many times a prefill


@pytest.fixture(scope="module")
def local_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineManager, int]]:
    yield from own_engine(tmp_path_factory, "retune-engine", LAUNCH)


async def alone_s(url: str) -> float:
    """One chat with its whole answer, alone (the least of two): the gate's TTFT limit."""
    run = CanaryRun(Workload(endpoint=f"{url}/v1/completions", concurrency=1, num_requests=3,
                             prompt_length=128, output_length=OUTPUT), metrics_url=None)  # fmt: skip
    await run.run()
    return min(r.e2e_s for r in run.records[1:] if r.e2e_s is not None)


async def test_the_re_tune_finds_the_slots_the_live_traffic_needs(
    tmp_path: Path, slack: FakeSlack, local_engine: tuple[EngineManager, int]
) -> None:
    manager, port = local_engine
    url = f"http://127.0.0.1:{port}"
    limit_ms = 1000 * await alone_s(url)
    target = {
        "vllm_url": url,
        "actuator": {"kind": "local", "flags": LAUNCH, "state_dir": str(manager.state_dir),
                     "start_timeout_s": 600},
        "canary": {"concurrency": STREAMS, "num_requests": 16, "timeout_s": 600},
        "drift": {"retune": "auto"},
    }  # fmt: skip
    live = fixed_shape(  # arrivals far faster than answers: the streams are always full
        Workload(endpoint=f"{url}/v1/completions", concurrency=STREAMS, num_requests=64,
                 prompt_length=128, output_length=OUTPUT), request_rate=1000.0,
    )  # fmt: skip
    h = harness(tmp_path, slack=slack, targets={"local": target})
    try:
        with h.bot.db.transaction() as s:
            incident_id = store.create(
                s, key="workload-drift:local", source="scheduler", title="local: drift",
                target="local", labels={"alertname": "RuleloopWorkloadDrift"}, at=h.wall.now(),
            ).id  # fmt: skip
        offer = Offer(target="local", adr_id=ADR_ID, fix={"max-num-seqs": 2},
                      gates={"max_ttft_p99_ms": limit_ms}, replaced={"max-num-seqs": 16},
                      live=live)  # fmt: skip
        await h.bot.retune.offer(incident_id, offer)
        await h.bot.tasks.drain(timeout_s=3600)
        with h.bot.db.transaction() as s:
            (session,) = s.scalars(select(TuneSession)).all()
            drafts = s.scalars(select(AdrDraft)).all()
        posted = [json.dumps(c.args, ensure_ascii=False) for c in slack.of("chat.postMessage")]
        print(f"\nTTFT limit {limit_ms:.0f} ms; {posted[-1]}")  # noqa: T201
        assert session.state == "restored"
        assert engine_flags(manager, port).get("max-num-seqs") == 2  # the fix serves again
        (draft,) = drafts
        adr = h.bot.retune._adrs.get_or_raise(draft.adr_id)  # noqa: SLF001
        rows = {row.config: row.verdict for row in adr.matrix}
        picked = adr.fix.engine_args["max-num-seqs"]
        assert picked in (4, 16), rows  # enough slots; 1 and 2 queue
        failing = [cfg for cfg, verdict in rows.items() if "不达标" in verdict]
        assert any("--max-num-seqs 1`" in cfg for cfg in failing) and any(
            "--max-num-seqs 2`" in cfg for cfg in failing
        ), rows
        assert adr.workload is not None and adr.status == "proposed"
        assert f"Drafted *{draft.adr_id}*, proven on the live workload" in posted[-1]
    finally:
        await h.close()
