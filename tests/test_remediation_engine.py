"""/apply-adr end to end on a real vLLM engine (CPU): signed Slack requests against the fake Slack,
the local actuator restarting the engine, the real canary against the ADR's gates.

One engine serves the module (its own port and state dir; the shared test engines are never
restarted). In order: a passing ADR is applied and kept (flags read back from the process and
from vLLM's own cache_config_info); an ADR whose gate cannot be met is rolled back and the old
flags serve again; a bot that stops mid-canary is resumed by a new one, which rolls back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from bot.adr.shared import SharedAdrStore
from bot.canary.schema import CanaryReport
from bot.canary.verdict import values_of
from bot.change.actuators.local import process_argv
from bot.change.argv import read_flags
from bot.diagnosis.probes.exposition import Exposition
from bot.engine.model import SERVED_MODEL_NAME
from bot.engine.process import EngineManager, free_port
from bot.gateway.app import Gateway
from bot.gateway.limits import Limits
from bot.gateway.server import GatewayServer, upstream_client
from bot.kernel.numbers.text import show
from bot.kernel.store.models import AdrDraft, CanaryResult, Remediation
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import FakeSlack

pytestmark = [pytest.mark.engine, pytest.mark.slow]
LAUNCH = ["--enforce-eager", "--max-num-seqs", "16"]
KEEP = "ADR-20261129-11"  # gates this engine meets
FAIL = "ADR-20261129-12"  # a TPOT gate no engine meets
HANG = "ADR-20261129-13"
ADMIN_TOKEN = "gateway-admin-secret"
CANARY = {"concurrency": 4, "num_requests": 12, "prompt_length": 128, "output_length": 16}


def adr_text(adr_id: str, flags: dict[str, Any], gates: str, gateway: str = "") -> str:
    engine_args = "".join(f"    {k}: {json.dumps(v)}\n" for k, v in flags.items())
    engine_args += f"  gateway:\n{gateway}" if gateway else ""
    return (
        f"---\nid: {adr_id}\ntitle: Test fix {adr_id}\nstatus: accepted\ndate: 2026-11-29\n"
        f"deciders:\n- test\nmatch: []\nfix:\n  engine_args:\n{engine_args}gates:\n{gates}---\n\n"
        f"# {adr_id}: Test fix {adr_id}\n\n## 1. 变更上下文 (Context)\n\nA test.\n\n"
        "## 2. 实验对比数据 (Metrics Matrix)\n\n"
        "| 配置参数 | TTFT (P99) | TPOT (P99) | Goodput | 显存碎片率 | 结论 |\n"
        "| :--- | :--- | :--- | :--- | :--- | :--- |\n\n"
        "## 3. 固化的系统规则 (Solidified Rules)\n\n- test\n"
    )


@pytest.fixture
async def gateway(local_engine: tuple[EngineManager, int]) -> AsyncIterator[tuple[str, Gateway]]:
    """A real gateway (uvicorn, in this loop) in front of the engine, admin endpoint on."""
    client = upstream_client(f"http://127.0.0.1:{local_engine[1]}")
    app = Gateway(client=client, limits=Limits(), admin_token=ADMIN_TOKEN)
    async with GatewayServer(app) as server:
        yield server.base_url, app
    await client.aclose()


def own_engine(
    tmp_path_factory: pytest.TempPathFactory, name: str, flags: list[str]
) -> Iterator[tuple[EngineManager, int]]:
    """An engine of a module's own, on a port of its own (the local actuator restarts it
    there with other flags), stopped at the end: its manager and port."""
    manager = EngineManager(state_dir=tmp_path_factory.mktemp(name))
    port = free_port()
    manager.start(port=port, flags=flags, timeout_s=600)
    try:
        yield manager, port
    finally:
        manager.stop(port)


@pytest.fixture(scope="module")
def local_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineManager, int]]:
    yield from own_engine(tmp_path_factory, "remediation-engine", LAUNCH)


def make_harness(
    tmp_path: Path, slack: FakeSlack, manager: EngineManager, port: int, gateway: str | None = None
) -> Harness:
    token_file = tmp_path / "gateway-admin-token"
    token_file.write_text(ADMIN_TOKEN)
    target: dict[str, Any] = {
        "vllm_url": f"http://127.0.0.1:{port}",
        "actuator": {"kind": "local", "flags": LAUNCH, "state_dir": str(manager.state_dir),
                     "start_timeout_s": 600},
        "canary": CANARY,
    }  # fmt: skip
    if gateway is not None:
        target |= {"gateway_url": gateway, "gateway_admin_token_file": str(token_file)}
    h = harness(tmp_path, slack=slack, targets={"local": target})
    adr_dir = tmp_path / "adr"
    generous = "  max_ttft_p99_ms: 60000\n  max_tpot_p99_ms: 5000\n  min_goodput_ratio: 0.5\n"
    flags = {"max-num-batched-tokens": 1024, "num-gpu-blocks-override": 512}
    for adr_id, change, gates, rules in (
        (KEEP, flags, generous, "    require_request_timeout: true\n    upstream_timeout_s: 30.0\n"),
        (FAIL, {"max-num-batched-tokens": 512}, "  max_tpot_p99_ms: 0.001\n",
         "    max_in_flight_tokens: 4096\n"),
        (HANG, {"max-num-batched-tokens": 768}, generous, ""),
    ):  # fmt: skip
        if not (adr_dir / f"{adr_id}-t.md").exists():
            (adr_dir / f"{adr_id}-t.md").write_text(adr_text(adr_id, change, gates, rules))
    return h


def engine_flags(manager: EngineManager, port: int) -> dict[str, Any]:
    """The tunable flags of the process serving ``port``, read from /proc."""
    info = manager.find(port)
    assert info is not None, "no engine serves the port"
    argv = process_argv(info.pid)
    assert argv is not None
    return read_flags(argv)


def cache_config(port: int) -> dict[str, str]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    (labels,) = Exposition.parse(text, at=0.0).labels_of("vllm:cache_config_info")
    return dict(labels)


async def approve(h: Harness, slack: FakeSlack, adr_id: str) -> Remediation:
    before = len(slack.of("chat.postMessage"))
    answered = len(slack.of("response_url"))
    response = await h.slash(f"{adr_id} local", command="/apply-adr")
    assert (response.status_code, response.text) == (200, ""), response.text  # acked at once
    answer = (await slack.until("response_url", answered + 1))[-1]  # then where the card is
    assert "confirmation card" in answer.args["text"], answer.args["text"]
    card = (await slack.until("chat.postMessage", before + 1))[-1]
    value = next(
        e["value"] for b in card.args["blocks"] if b["type"] == "actions" for e in b["elements"]
        if e["action_id"] == "remediation_approve"
    )  # fmt: skip
    await h.click(value, user="U2", action_id="remediation_approve")
    with h.bot.db.transaction() as s:
        return s.scalars(select(Remediation).order_by(Remediation.id.desc())).first()  # type: ignore[return-value]


async def finished(h: Harness, remediation_id: int, *, timeout_s: float = 900) -> Remediation:
    for _ in range(int(timeout_s)):
        with h.bot.db.transaction() as s:
            rem = s.get(Remediation, remediation_id)
        assert rem is not None
        if rem.state in ("promoted", "rolled_back", "failed", "dry_run"):
            # Outside the transaction: on SQLite it holds the write lock, and the work being
            # drained (the post-incident draft) waited for it until "database is locked".
            await h.bot.tasks.drain(timeout_s=120)
            return rem
        await asyncio.sleep(1)
    raise AssertionError(f"remediation {remediation_id} still {rem.state}")


async def test_an_accepted_adr_is_applied_kept_and_drafted(
    tmp_path: Path,
    slack: FakeSlack,
    local_engine: tuple[EngineManager, int],
    gateway: tuple[str, Gateway],
) -> None:
    manager, port = local_engine
    h = make_harness(tmp_path, slack, manager, port, gateway=gateway[0])
    try:
        old_pid = manager.find(port).pid  # type: ignore[union-attr]
        rem = await finished(h, (await approve(h, slack, KEEP)).id)
        assert rem.state == "promoted", rem.result
        # read back from the engine: its process and vLLM's own config metric
        flags = engine_flags(manager, port)
        assert flags["max-num-batched-tokens"] == 1024 and flags["num-gpu-blocks-override"] == 512
        assert manager.find(port).pid != old_pid  # type: ignore[union-attr]
        assert cache_config(port)["num_gpu_blocks_override"] == "512"
        # the ADR's gateway rules are in force on the live gateway
        limits = gateway[1].limits
        assert (limits.require_timeout_header, limits.default_timeout_s) == (True, 30.0)
        # the card shows the canary's numbers; the draft's matrix equals the canary JSON
        with h.bot.db.transaction() as s:
            (canary,) = s.scalars(select(CanaryResult)).all()
            draft = s.scalars(select(AdrDraft)).one()
        values = values_of(CanaryReport.of(canary.report))
        last = slack.of("chat.update")[-1].args
        assert last["text"] == f"{KEEP} on local: applied: the canary met every gate"
        assert f"TTFT p99 {show('ttft_p99_ms', values.ttft_p99_ms)}" in json.dumps(
            last["blocks"], ensure_ascii=False
        )
        adr = SharedAdrStore(root=tmp_path / "adr", db=h.bot.db).get_or_raise(draft.adr_id)
        row = adr.matrix[-1]
        assert (row.ttft_p99_ms, row.tpot_p99_ms) == (
            round(values.ttft_p99_ms, 1),
            round(values.tpot_p99_ms, 1),  # type: ignore[arg-type]
        )
        # A fragmentation no in-flight sample could measure (the canary's streams all ended
        # between two samples) is an empty cell in the draft, never a made-up number.
        frag = values.kv_fragmentation
        assert (row.goodput_ratio, row.kv_fragmentation) == (
            round(values.goodput_ratio, 3),
            None if frag is None else round(frag, 3),
        )
        assert adr.fix.engine_args == {
            "max-num-batched-tokens": 1024,
            "num-gpu-blocks-override": 512,
        }
    finally:
        await h.close()


async def test_a_failing_gate_rolls_back_and_the_old_flags_serve_again(
    tmp_path: Path,
    slack: FakeSlack,
    local_engine: tuple[EngineManager, int],
    gateway: tuple[str, Gateway],
) -> None:
    manager, port = local_engine
    h = make_harness(tmp_path, slack, manager, port, gateway=gateway[0])
    try:
        before = engine_flags(manager, port)
        limits_before = gateway[1].limits
        rem = await finished(h, (await approve(h, slack, FAIL)).id)
        assert rem.state == "rolled_back", rem.result
        assert engine_flags(manager, port) == before
        assert gateway[1].limits == limits_before  # the budget of 4096 was undone too
        assert rem.before["gateway"]["max_inflight_tokens"] == 0
        assert rem.result["failures"][0].startswith("TPOT p99 ")
        last = slack.of("chat.update")[-1].args
        assert last["text"] == f"{FAIL} on local: rolled back: the previous flags serve again"
        shown = json.dumps(last["blocks"], ensure_ascii=False)
        assert "canary failed the gates: TPOT p99 " in shown and "Rolled back:" in shown
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": SERVED_MODEL_NAME, "prompt": [100, 101], "max_tokens": 2},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
    finally:
        await h.close()


async def test_a_restart_mid_canary_is_rolled_back_by_the_next_bot(
    tmp_path: Path, slack: FakeSlack, local_engine: tuple[EngineManager, int]
) -> None:
    manager, port = local_engine
    before = engine_flags(manager, port)
    started = asyncio.Event()

    async def hung_gate(*args: object, **kwargs: object) -> object:
        started.set()
        await asyncio.Event().wait()  # the bot dies before the canary ends
        raise AssertionError("unreachable")

    h = make_harness(tmp_path, slack, manager, port)
    h.bot.remediation._gate = hung_gate  # noqa: SLF001 - the one seam this test needs
    rem = await approve(h, slack, HANG)
    await asyncio.wait_for(started.wait(), timeout=900)
    assert engine_flags(manager, port)["max-num-batched-tokens"] == 768
    await h.bot.tasks.drain(timeout_s=0.1)  # "kill": the run is cancelled mid-canary
    await h.close()
    with h.bot.db.transaction() as s:
        assert s.get(Remediation, rem.id).state == "canary"  # type: ignore[union-attr]

    again = make_harness(tmp_path, slack, manager, port)  # same store, a new bot
    try:
        # stale at once: the old run's last heartbeat is older than now, by the database's clock
        assert await again.bot.remediation.resume(stale_s=0) == 1
        with again.bot.db.transaction() as s:
            assert s.get(Remediation, rem.id).state == "rolled_back"  # type: ignore[union-attr]
        assert engine_flags(manager, port) == before
        text = slack.of("chat.update")[-1].args["text"]
        assert text == f"{HANG} on local: rolled back: the previous flags serve again"
    finally:
        await again.close()
