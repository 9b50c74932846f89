"""The nvml probe against a real `ruleloop agent` process (its NVML the fake one, injected as the
`pynvml` module it imports): the reading and its source, and every failure as a finding.

The probe's own host has no GPU (ctx.nvml is the no-driver fake), so a reading with GPUs can
only have come from the agent. The last tests run a whole diagnosis in the real bot: the Slack
findings name the agent; with no agent they say "in-process" and "no GPU visible".
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.diagnosis.probes.context import ProbeContext, TargetRef
from bot.diagnosis.probes.nvml import NvmlParams, NvmlProbe
from bot.diagnosis.probes.types import ProbeResult, Severity
from bot.engine.process import free_port
from bot.kernel.config import Target
from tests.conftest import FIXTURES
from tests.fakes.alerts import body
from tests.fakes.bot import engine_transport, harness
from tests.fakes.nvml import FakeNvml
from tests.fakes.nvml_agent import TOKEN, AgentProcess, running_agent
from tests.fakes.slack_api import FakeSlack

H200 = ["--fixture", str(FIXTURES / "nvml" / "h200-x2.json")]


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    """H200 x2; GPU 0 raised XID 79 just after the agent started listening."""
    with running_agent(tmp_path_factory.mktemp("agent"), *H200, "--xid", "0:79") as process:
        _wait_for_xid(process)
        yield process


def _wait_for_xid(agent: AgentProcess) -> None:
    """The XID thread counts the event on its own time: poll until the snapshot shows it."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for _ in range(600):
        body = httpx.get(f"{agent.url}/snapshot", headers=headers, timeout=10).json()
        if body["gpus"][0]["xid"]["count"] == 1:
            return
        import time

        time.sleep(0.05)
    raise AssertionError(f"the agent never counted the XID: {body}")


def target(url: str, token_file: Path | None) -> TargetRef:
    spec = Target(
        vllm_url="http://10.0.0.5:8000", node="gpu-node-7", gpu_agent_url=url,
        gpu_agent_token_file=token_file,
    )  # fmt: skip
    return TargetRef("prod-a", spec)


async def probe(ref: TargetRef, **params: Any) -> ProbeResult:
    async with httpx.AsyncClient() as http:
        ctx = ProbeContext(http=http, nvml=FakeNvml.no_driver(), hostname="bot-pod")
        return await NvmlProbe().run(target=ref, params=NvmlParams(**params), ctx=ctx)


def findings(result: ProbeResult) -> list[tuple[Severity, str]]:
    return [(f.severity, f.message) for f in result.findings]


async def test_the_probe_reads_the_agent_and_says_so(agent: AgentProcess) -> None:
    result = await probe(target(agent.url, agent.token_file))
    r = result.readings.numbers
    assert r["gpu_count"] == 2 and r["utilization_pct"] == 100 and r["temperature_c"] == 83
    assert r["throttled_gpus"] == 1 and r["xid_errors"] == 1
    assert r["power_limit_ratio"] == pytest.approx(699812 / 700000)
    host = socket.gethostname()
    assert result.details["source"] == {"kind": "agent", "where": agent.url}
    assert result.details["host"] == host
    info, _ = [m for s, m in findings(result) if s is Severity.INFO]  # the source, the cap
    assert (
        info
        == f"GPU reading from the agent at {agent.url} (host {host}): 2 GPU(s), driver 570.124.06"
    )
    (critical,) = [m for s, m in findings(result) if s is Severity.CRITICAL]
    assert critical.startswith("GPU 0 raised 1 XID error(s) since ")
    assert critical.endswith(": XID 79 (GPU fell off the bus); drain the node")
    # the power cap alone is no fault: said, not warned about
    assert (Severity.INFO, "GPU 1 is throttled: software power cap") in findings(result)
    assert r["slowdown_gpus"] == 0 and r["power_capped_gpus"] == 1
    assert result.details["gpus"][0]["processes"] == [
        {"pid": 4242, "used_memory_bytes": 145961779200}
    ]


async def test_max_processes_reaches_the_agent(agent: AgentProcess) -> None:
    result = await probe(target(agent.url, agent.token_file), max_processes=0)
    assert result.details["gpus"][0]["processes"] == []


async def test_a_wrong_token_is_a_finding(agent: AgentProcess, tmp_path: Path) -> None:
    wrong = tmp_path / "token"
    wrong.write_text("not-the-agents-token-0123456789")
    result = await probe(target(agent.url, wrong))
    assert result.readings.numbers == {}
    assert findings(result) == [(
        Severity.WARNING,
        f"GPU reading failed: the GPU agent at {agent.url} refused the bot's token (HTTP 401); "
        "set gpu_agent_token_file to a file holding the agent's --token-file content",
    )]  # fmt: skip
    assert result.details["source"] == {"kind": "agent", "where": agent.url}


async def test_no_token_configured_is_a_finding(agent: AgentProcess) -> None:
    result = await probe(target(agent.url, None))
    ((severity, message),) = findings(result)
    assert severity is Severity.WARNING and "was sent no token (HTTP 401)" in message


async def test_an_unreadable_token_file_is_a_finding(agent: AgentProcess, tmp_path: Path) -> None:
    result = await probe(target(agent.url, tmp_path / "missing"))
    ((severity, message),) = findings(result)
    assert severity is Severity.WARNING
    assert message.startswith(
        f"GPU reading failed: cannot read gpu_agent_token_file {tmp_path}/missing"
    )


async def test_agent_down_is_a_finding(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = await probe(target(url, None))
    ((severity, message),) = findings(result)
    assert severity is Severity.WARNING
    assert message.startswith(f"GPU reading failed: cannot reach the GPU agent at {url} (")
    assert "check that `ruleloop agent` runs there" in message


async def test_an_agent_that_never_answers_is_a_timeout_finding() -> None:
    # Built, not timed: the kernel accepts the connection into the backlog and no one reads it.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        result = await probe(target(url, None), agent_timeout_s=0.2)
    ((severity, message),) = findings(result)
    assert severity is Severity.WARNING
    assert message == (
        f"GPU reading failed: the GPU agent at {url} did not answer within 0.2 s; "
        "check that its pod is running and not starved of CPU"
    )


async def test_an_agent_without_nvml_says_no_gpu_visible_there(tmp_path: Path) -> None:
    with running_agent(tmp_path, "--no-driver") as agent:
        result = await probe(target(agent.url, agent.token_file))
    assert result.readings.numbers == {"gpu_count": 0.0}
    assert findings(result) == [(
        Severity.WARNING,
        f"no GPU visible to NVML from the agent at {agent.url} (the GPU agent at {agent.url} "
        "sees no GPU: NVML Shared Library Not Found)",
    )]  # fmt: skip


async def test_an_nvml_error_at_the_agent_is_a_finding(tmp_path: Path) -> None:
    with running_agent(tmp_path, *H200, "--lost", "1") as agent:
        result = await probe(target(agent.url, agent.token_file))
    assert findings(result) == [(
        Severity.WARNING,
        f"GPU reading failed: the GPU agent at {agent.url} answered HTTP 500: "
        "NVML failed while reading: GPU is lost",
    )]  # fmt: skip


async def test_a_url_that_is_not_an_agent_is_a_finding() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"status": "ok"})  # e.g. some other service's page

    ref = target("http://not-an-agent:80", None)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        ctx = ProbeContext(http=http, nvml=FakeNvml.no_driver(), hostname="bot-pod")
        result = await NvmlProbe().run(target=ref, params=NvmlParams(), ctx=ctx)
    ((_, message),) = findings(result)
    assert (
        "did not answer a ruleloop.nvml/v1 snapshot: is gpu_agent_url a ruleloop agent?" in message
    )


# --- a whole diagnosis in the real bot ------------------------------------------------------


class EngineAndAgent(httpx.AsyncBaseTransport):
    """The engine's recorded /metrics pages; everything else (the agent) over the network."""

    def __init__(self) -> None:
        self.engine = engine_transport()
        self.network = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == "10.0.0.5":
            return await self.engine.handle_async_request(request)
        return await self.network.handle_async_request(request)

    async def aclose(self) -> None:
        await self.network.aclose()


def _texts(blocks: list[dict]) -> str:
    return json.dumps(blocks, ensure_ascii=False)


async def test_slack_findings_name_the_agent(
    agent: AgentProcess, tmp_path: Path, slack: FakeSlack
) -> None:
    targets = {"prod-a": {"vllm_url": "http://10.0.0.5:8000", "actuator": {"kind": "dry-run"},
                          "gpu_agent_url": agent.url, "gpu_agent_token_file": str(agent.token_file)}}  # fmt: skip
    h = harness(tmp_path, slack=slack, transport=EngineAndAgent(), targets=targets)
    try:
        assert (await h.slash("prod-a")).status_code == 200
        await slack.until("chat.update")
        await h.bot.tasks.drain()
    finally:
        await h.close()
    _, findings_message, *_ = slack.of("chat.postMessage")
    shown = _texts(findings_message.args["blocks"])
    assert f"GPU reading from the agent at {agent.url}" in shown
    assert "XID 79 (GPU fell off the bus)" in shown and "GPU 1 is throttled" in shown
    assert "no GPU visible" not in shown


async def test_console_findings_say_in_process_and_no_gpu(tmp_path: Path) -> None:
    """What the demo prints: no agent configured, this host's NVML, no GPU here."""
    h = harness(tmp_path, slack=None)
    try:
        assert (await h.webhook(body())).status_code == 202
        await h.bot.tasks.drain()
    finally:
        await h.close()
    printed = h.console.getvalue()
    assert f"no GPU visible to NVML in-process on {socket.gethostname()} (" in printed, printed


def test_gpu_agent_url_must_be_an_http_url() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="is not an http"):
        Target(vllm_url="http://10.0.0.5:8000", gpu_agent_url="10.0.0.5:9401")


async def test_an_xid_from_the_agent_supports_the_gpu_cause(agent: AgentProcess) -> None:
    """Cause (f) on the wire: the shipped runbook's GPU hypothesis judged on what the real agent
    reports (XID 79 on GPU 0, GPU 1 power-capped), the same readings a diagnosis gets."""
    from bot.diagnosis.causes import judge
    from bot.diagnosis.runbooks.builtin import default_registry
    from bot.diagnosis.runbooks.loader import load_file
    from bot.kernel.numbers import Measured

    result = await probe(target(agent.url, agent.token_file))
    loaded = load_file(
        FIXTURES.parent.parent / "runbooks" / "vllm-latency.yaml", default_registry()
    )
    readings = {f"nvml.{name}": value for name, value in result.readings.numbers.items()}
    verdicts = {v.cause: v for v in judge(loaded.runbook, Measured.of(readings, {}, {}))}
    gpu = verdicts["gpu_fault"]
    assert gpu.verdict == "supported" and gpu.number == "GPUs slowed down: 0, XID errors: 1", gpu

    def gpu_verdict(**changed: float | None) -> str:
        seen = readings | {f"nvml.{k}": v for k, v in changed.items()}
        return {v.cause: v for v in judge(loaded.runbook, Measured.of(seen, {}, {}))}[
            "gpu_fault"
        ].verdict

    assert gpu_verdict(slowdown_gpus=0) == "supported"  # the XID alone
    # GPU 1 at its software power cap is no fault (as in the DCGM runbook); a slowdown is
    assert gpu_verdict(xid_errors=0, ecc_uncorrected=0) == "ruled_out"
    assert gpu_verdict(xid_errors=0, ecc_uncorrected=0, slowdown_gpus=1) == "supported"
    assert gpu_verdict(xid_errors=None, ecc_uncorrected=0) == "cannot_tell"
