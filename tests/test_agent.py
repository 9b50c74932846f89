"""`ruleloop agent` against the fake NVML: the snapshot, the token, NVML missing or failing, XIDs.

The app is the real Starlette app over a real NvmlSession (its XID watcher thread included);
only the `pynvml` module is the fake, as in the probe tests. The last tests run the real
process (`python -m tests.fakes.nvml ... -- agent`) and its command line.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from bot.agent.app import create_app
from bot.agent.session import NvmlSession
from bot.app.cli import cli
from tests.conftest import FIXTURES
from tests.fakes.nvml import FakeNvml
from tests.fakes.nvml_agent import TOKEN, AgentProcess, running_agent

H200 = FIXTURES / "nvml" / "h200-x2.json"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def h200() -> FakeNvml:
    return FakeNvml.from_file(H200)


@pytest.fixture
async def served(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[httpx.AsyncClient, FakeNvml]]:
    """A client for the app over the fake given by the test's `nvml` param (default: H200 x2)."""
    fake = getattr(request, "param", None) or h200()
    session = NvmlSession(fake, hostname="gpu-node-7")
    app = create_app(session, token=TOKEN)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent")
    yield client, fake
    await client.aclose()
    session.close()
    assert fake.initialised == 0  # NVML shut down on close


async def test_snapshot_reads_every_gpu(served: tuple[httpx.AsyncClient, FakeNvml]) -> None:
    client, _ = served
    response = await client.get("/snapshot", headers=AUTH)
    assert response.status_code == 200
    body = response.json()
    assert body["schema"] == "ruleloop.nvml/v1" and body["host"] == "gpu-node-7"
    assert body["driver"] == "570.124.06"
    gpu0, gpu1 = body["gpus"]
    assert gpu0["memory_used_bytes"] == 146028888064 and gpu0["memory_total_bytes"] == 150754820096
    assert (gpu0["utilization_pct"], gpu0["memory_utilization_pct"]) == (97, 61)
    assert (gpu0["temperature_c"], gpu0["power_w"], gpu0["power_limit_w"]) == (71, 612.345, 700.0)
    assert (gpu1["sm_clock_mhz"], gpu1["sm_clock_max_mhz"]) == (1455, 1980)
    assert gpu1["clock_event_reasons"] == ["software power cap"]
    assert gpu1["throttle_reasons"] == ["software power cap"] and gpu0["throttle_reasons"] == []
    assert gpu0["ecc_uncorrected"] == 0 and gpu1["ecc_uncorrected"] is None  # not supported
    assert gpu0["processes"] == [{"pid": 4242, "used_memory_bytes": 145961779200}]
    assert gpu0["xid"]["watching"] is True and gpu0["xid"]["count"] == 0
    assert gpu0["uuid"].startswith("GPU-")


async def test_snapshot_limits_the_process_list(served: tuple[httpx.AsyncClient, FakeNvml]) -> None:
    client, _ = served
    body = (await client.get("/snapshot?max_processes=0", headers=AUTH)).json()
    assert body["gpus"][0]["processes"] == [] and body["gpus"][0]["processes_total"] == 1
    bad = await client.get("/snapshot?max_processes=lots", headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_request"
    assert "max_processes must be a whole number" in bad.json()["error"]["message"]


def _clock_reasons(mask: int) -> FakeNvml:
    reading = json.loads(H200.read_text())
    reading["gpus"][0]["clock_event_reasons"] = mask
    return FakeNvml(reading)


@pytest.mark.parametrize(
    "served", [_clock_reasons(0x1 | 0x40 | 0x80)], indirect=True, ids=["idle+thermal+brake"]
)
async def test_reasons_are_decoded_and_only_limits_count_as_throttling(
    served: tuple[httpx.AsyncClient, FakeNvml],
) -> None:
    client, _ = served
    gpu0 = (await client.get("/snapshot", headers=AUTH)).json()["gpus"][0]
    assert gpu0["clock_event_reasons_mask"] == 0xC1
    assert gpu0["clock_event_reasons"] == ["gpu idle", "hardware thermal slowdown", "power brake"]
    assert gpu0["throttle_reasons"] == ["hardware thermal slowdown", "power brake"]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token-0123456789abcdef"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},  # a prefix of the right one
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
    ],
    ids=["none", "wrong", "prefix", "basic", "no-scheme"],
)
async def test_snapshot_needs_the_token(
    served: tuple[httpx.AsyncClient, FakeNvml], headers: dict[str, str]
) -> None:
    client, fake = served
    response = await client.get("/snapshot", headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    error = response.json()["error"]
    assert error["code"] == "unauthorized" and "Authorization: Bearer" in error["hint"]
    assert fake.initialised == 0  # NVML is not even touched for a refused request


async def test_healthz_needs_no_token(served: tuple[httpx.AsyncClient, FakeNvml]) -> None:
    client, _ = served
    response = await client.get("/healthz")
    assert response.status_code == 200
    # the node's name only to a client with the token (issue 22, item 7)
    assert response.json() == {"status": "ok", "nvml": "not read yet"}
    with_token = await client.get("/healthz", headers=AUTH)
    assert with_token.json() == {"status": "ok", "host": "gpu-node-7", "nvml": "not read yet"}
    wrong = await client.get("/healthz", headers={"Authorization": "Bearer wrong"})
    assert wrong.status_code == 200 and "host" not in wrong.json()
    await client.get("/snapshot", headers=AUTH)
    assert (await client.get("/healthz")).json()["nvml"] == "ok"


async def test_read_only(served: tuple[httpx.AsyncClient, FakeNvml]) -> None:
    client, _ = served
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        response = await client.request(method, "/snapshot", headers=AUTH)
        assert response.status_code == 405, method
        assert response.json()["error"]["code"] == "method_not_allowed"
    missing = await client.get("/gpus", headers=AUTH)
    assert missing.status_code == 404 and "GET /snapshot" in missing.json()["error"]["hint"]


@pytest.mark.parametrize("served", [FakeNvml.no_driver()], indirect=True, ids=["no-driver"])
async def test_no_driver_is_a_json_503(served: tuple[httpx.AsyncClient, FakeNvml]) -> None:
    client, _ = served
    response = await client.get("/snapshot", headers=AUTH)
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "nvml_unavailable"
    assert error["message"] == "NVML Shared Library Not Found"
    assert "NVIDIA_VISIBLE_DEVICES" in error["hint"]
    health = (await client.get("/healthz")).json()
    assert health["status"] == "ok"  # alive: it answers why, rather than restarting
    assert health["nvml"] == "nvml_unavailable: NVML Shared Library Not Found"


def _lost_gpu() -> FakeNvml:
    fake = h200()
    fake.lost.add(1)
    return fake


@pytest.mark.parametrize("served", [_lost_gpu()], indirect=True, ids=["lost-gpu"])
async def test_nvml_failing_mid_read_is_a_json_500(
    served: tuple[httpx.AsyncClient, FakeNvml],
) -> None:
    client, fake = served
    response = await client.get("/snapshot", headers=AUTH)
    assert response.status_code == 500
    assert response.json()["error"] == {
        "code": "nvml_error",
        "message": "NVML failed while reading: GPU is lost",
        "hint": "NVML answered with an error: check `nvidia-smi` and the node's kernel log",
    }
    fake.lost.clear()  # the GPU is back: the next request reads it, no restart needed
    assert (await client.get("/snapshot", headers=AUTH)).status_code == 200


async def _snapshot_when(client: httpx.AsyncClient, done: object, *, attempts: int = 600) -> dict:
    """Poll /snapshot until ``done(body)``: the XID thread delivers events on its own time."""
    assert callable(done)
    for _ in range(attempts):
        body = (await client.get("/snapshot", headers=AUTH)).json()
        if done(body):
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"condition never met; last snapshot: {body}")


async def test_xid_errors_are_counted_per_gpu(served: tuple[httpx.AsyncClient, FakeNvml]) -> None:
    client, fake = served
    await client.get("/snapshot", headers=AUTH)  # NVML initialised, the watcher listening
    assert fake.registered == {0, 1}
    fake.raise_xid(1, 79)
    fake.raise_xid(1, 13)
    body = await _snapshot_when(client, lambda b: b["gpus"][1]["xid"]["count"] == 2)
    xid = body["gpus"][1]["xid"]
    assert [e["xid"] for e in xid["recent"]] == [79, 13]
    assert body["gpus"][0]["xid"]["count"] == 0


def _xid_unsupported() -> FakeNvml:
    reading = json.loads(H200.read_text())
    reading["gpus"][1]["xid_events"] = False
    return FakeNvml(reading)


@pytest.mark.parametrize("served", [_xid_unsupported()], indirect=True, ids=["gpu1-no-events"])
async def test_xid_not_supported_says_so(served: tuple[httpx.AsyncClient, FakeNvml]) -> None:
    client, _ = served
    gpus = (await client.get("/snapshot", headers=AUTH)).json()["gpus"]
    assert gpus[0]["xid"]["watching"] is True and gpus[0]["xid"]["why_not"] is None
    assert gpus[1]["xid"]["watching"] is False and gpus[1]["xid"]["why_not"] == "Not Supported"


async def test_without_a_token_only_when_asked() -> None:
    session = NvmlSession(h200(), hostname="h")
    app = create_app(session, token=None)  # what --insecure-no-auth serves
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        assert (await c.get("/snapshot")).status_code == 200
    session.close()


# --- the command line ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ([], {}, "the agent needs a bearer token: --token-file PATH or $RULELOOP_AGENT_TOKEN"),
        (["--token-file", "{empty}"], {}, "is empty: write the token into it"),
        (["--token-file", "{missing}"], {}, "cannot read --token-file"),
        ([], {"RULELOOP_AGENT_TOKEN": "short"}, "the token is 5 characters; use at least 16"),
        (
            ["--insecure-no-auth"],
            {"RULELOOP_AGENT_TOKEN": TOKEN},
            "--insecure-no-auth and a token were both given",
        ),
        (["--listen", "9401", "--insecure-no-auth"], {}, "must be HOST:PORT"),
    ],
    ids=["no-token", "empty-file", "missing-file", "short", "both", "bad-listen"],
)
def test_cli_refuses_to_start_without_a_usable_token(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    (tmp_path / "empty").write_text("\n")
    args = [a.format(empty=tmp_path / "empty", missing=tmp_path / "nope") for a in args]
    result = CliRunner().invoke(cli, ["agent", *args], env={"RULELOOP_AGENT_TOKEN": "", **env})
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_cli_help_teaches() -> None:
    result = CliRunner().invoke(cli, ["agent", "--help"])
    assert result.exit_code == 0
    for needed in ("--token-file", "--insecure-no-auth", "/snapshot", "gpu_agent_url",
                   "openssl rand", "docs/agent.md"):  # fmt: skip
        assert needed in result.output, needed


def test_the_process_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    with running_agent(tmp_path, "--fixture", str(H200)) as agent:
        ok = httpx.get(f"{agent.url}/snapshot", headers=AUTH, timeout=10)
        assert ok.status_code == 200 and len(ok.json()["gpus"]) == 2
        assert httpx.get(f"{agent.url}/snapshot", timeout=10).status_code == 401
        agent.process.send_signal(signal.SIGTERM)
        _, err = agent.process.communicate(timeout=30)
        assert agent.process.returncode == 0, err
        assert f"agent on {agent.url} (bearer token)" in err
        # text by default: the line a person reads, as `ruleloop serve` writes it
        assert f"INFO ruleloop.agent: agent on {agent.url}" in err and not err.startswith("{")


def _stopped_log(agent: AgentProcess, xid_seen: bool) -> list[str]:
    """Stop the agent (once /snapshot counts the XID the fake raised, if ``xid_seen``); its
    stderr, line by line."""
    deadline = time.monotonic() + 30
    while xid_seen and time.monotonic() < deadline:
        gpus = httpx.get(f"{agent.url}/snapshot", headers=AUTH, timeout=10).json()["gpus"]
        if gpus[1]["xid"]["count"] == 1:
            break
        time.sleep(0.05)
    agent.process.send_signal(signal.SIGTERM)
    _, err = agent.process.communicate(timeout=30)
    assert agent.process.returncode == 0, err
    return err.splitlines()


@pytest.mark.parametrize(
    ("agent_args", "env"),
    [(("--log-format", "json"), {}), ((), {"RULELOOP_LOG_FORMAT": "json"})],
    ids=["flag", "env"],
)
def test_the_process_logs_json_lines(
    tmp_path: Path, agent_args: tuple[str, ...], env: dict[str, str]
) -> None:
    """--log-format json (or the bot's $RULELOOP_LOG_FORMAT): every line on stderr is one JSON
    object with the bot's fields (bot/kernel/runtime/logs.py), the XID warning included."""
    fake = ("--fixture", str(H200), "--xid", "1:79")
    with running_agent(tmp_path, *fake, agent_args=agent_args, env=env) as agent:
        lines = _stopped_log(agent, xid_seen=True)
    records = [json.loads(line) for line in lines]  # fails on any line that is not JSON
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records), records
    started = {"level": "INFO", "logger": "ruleloop.agent",
               "message": f"agent on {agent.url} (bearer token); GET /snapshot, /healthz"}  # fmt: skip
    assert started.items() <= records[0].items()
    assert datetime.fromisoformat(records[0]["time"]).utcoffset() == timedelta(0)
    xid = {"level": "WARNING", "logger": "ruleloop.agent", "message": "XID 79 on GPU 1"}
    assert [r for r in records if xid.items() <= r.items()], records


def test_the_process_log_level(tmp_path: Path) -> None:
    """--log-level warning drops the agent's info line and keeps its warnings."""
    fake = ("--fixture", str(H200), "--xid", "1:79")
    with running_agent(tmp_path, *fake, agent_args=("--log-level", "warning")) as agent:
        lines = _stopped_log(agent, xid_seen=True)
    assert not [line for line in lines if "agent on" in line], lines
    assert [line for line in lines if "WARNING ruleloop.agent: XID 79 on GPU 1" in line], lines


def test_the_process_reports_a_busy_port(tmp_path: Path) -> None:
    import subprocess
    import sys

    with running_agent(tmp_path, "--fixture", str(H200)) as agent:
        port = agent.url.rsplit(":", 1)[1]
        second = subprocess.run(
            [sys.executable, "-m", "tests.fakes.nvml", "--fixture", str(H200), "--", "agent",
             "--listen", f"127.0.0.1:{port}", "--token-file", str(agent.token_file)],
            cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert second.returncode == 2
    assert f"error: cannot listen on 127.0.0.1:{port}" in second.stderr
    assert "Traceback" not in second.stderr


def test_once_prints_a_snapshot_or_says_why_not(tmp_path: Path) -> None:
    import subprocess
    import sys

    def once(*fake: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tests.fakes.nvml", *fake, "--", "agent", "--once"],
            cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    ok = once("--fixture", str(H200))
    assert ok.returncode == 0, ok.stderr
    assert [g["name"] for g in json.loads(ok.stdout)["gpus"]] == ["NVIDIA H200", "NVIDIA H200"]
    missing = once("--no-driver")
    assert missing.returncode == 2 and missing.stdout == ""
    assert (
        "cannot read NVML on" in missing.stderr
        and "NVML Shared Library Not Found" in missing.stderr
    )


def _reserved(*, v2: bool) -> FakeNvml:
    reading = json.loads(H200.read_text())
    reading["gpus"][1]["memory"] = {"total": 150754820096, "reserved": 536870912,
                                    "used": 1048576, "free": 150217949184}  # fmt: skip
    fake = FakeNvml(reading)
    if not v2:
        fake.nvmlMemory_v2 = None  # type: ignore[assignment]  # an nvidia-ml-py without v2
    return fake


@pytest.mark.parametrize(
    ("served", "used", "reserved"),
    [(_reserved(v2=True), 1048576, 536870912), (_reserved(v2=False), 537919488, None)],
    indirect=["served"],
    ids=["v2", "v1"],
)
async def test_memory_used_is_what_nvidia_smi_shows(
    served: tuple[httpx.AsyncClient, FakeNvml], used: int, reserved: int | None
) -> None:
    """Memory info v2 leaves the driver's reservation out of `used`, as nvidia-smi does; v1
    (older drivers) counts it in."""
    client, _ = served
    gpu1 = (await client.get("/snapshot", headers=AUTH)).json()["gpus"][1]
    assert (gpu1["memory_used_bytes"], gpu1["memory_reserved_bytes"]) == (used, reserved)
