"""docs/troubleshooting.md quotes what the bot and the canary really print.

Each message is produced here by the real code path (the bot's ASGI app and its diagnosis with
the Slack Web API faked at the wire, the canary CLI against a local streaming server whose
/metrics is not vLLM's) and must appear in the page verbatim, once this installation's values
(host:port, host name, channel ID) are replaced by the page's placeholders. A message that
changes in the code fails here until the page says the new text.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
from pathlib import Path

import httpx
import pytest

from tests.fakes.bot import PAGES, harness
from tests.fakes.slack_api import FakeSlack
from tests.fakes.sse_engine import SseEngine

ROOT = Path(__file__).parent.parent
DOC = ROOT / "docs" / "troubleshooting.md"
NOT_VLLM = "# HELP node_load1 1m load average.\n# TYPE node_load1 gauge\nnode_load1 0.42\n"


def page() -> str:
    return DOC.read_text()


def as_quoted(text: str, **placeholders: str) -> str:
    """``text`` with this run's values replaced by the page's placeholders."""
    for value, placeholder in placeholders.items():
        text = text.replace(value, placeholder)
    return text


async def test_alertmanager_answers_are_the_ones_quoted(tmp_path: Path, slack: FakeSlack) -> None:
    h = harness(tmp_path, slack=slack)
    try:
        wrong = await h.webhook(b"{}", token="not-the-token")
        right = await h.webhook(b"{}")
    finally:
        await h.close()
    assert (wrong.status_code, right.status_code) == (401, 422)
    assert f"{wrong.text}                                     401: it is not" in page()
    assert f"{right.text}   422: the token is right" in page()
    # Alertmanager's log quotes the body with its quotes escaped
    assert json.dumps(wrong.text)[1:-1] + '"' in page()
    (tmp_path / "unset").mkdir()
    unset = harness(tmp_path / "unset", slack=slack, alertmanager={})
    try:
        refused = await unset.webhook(b"{}")
    finally:
        await unset.close()
    assert refused.status_code == 503 and f"A **503** with `{refused.text}`" in page()


async def test_the_private_channel_and_no_gpu_messages_are_the_ones_quoted(
    tmp_path: Path, slack: FakeSlack
) -> None:
    slack.joined.clear()
    slack.private.add("C0INCIDENTS")
    h = harness(tmp_path, slack=slack)
    try:
        await h.slash("prod-a")
        await slack.until("chat.update")
        await h.bot.tasks.drain()
    finally:
        await h.close()
    texts = [json.dumps(c.args, ensure_ascii=False) for c in slack.of("chat.postMessage")]
    chart = slack.of("chat.postMessage")[-1].args["text"]
    assert chart.startswith("The chart could not be posted: ")
    assert as_quoted(chart, C0INCIDENTS="C0123ABCD") in page()
    (gpu,) = {m for t in texts for m in re.findall(r"no GPU visible to NVML .*?\)(?=  _\()", t)}
    host = f"in-process on {socket.gethostname()} ("
    assert as_quoted(gpu, **{host: "in-process on ruleloop-7c9f6d-abcde ("}) in page()


async def test_a_metrics_page_that_is_not_vllms_reads_as_quoted_from_the_bot(
    tmp_path: Path, slack: FakeSlack
) -> None:
    def engine(request: httpx.Request) -> httpx.Response:  # an exporter where vLLM should be
        return httpx.Response(200, text=NOT_VLLM if request.url.path == "/metrics" else "")

    h = harness(tmp_path, slack=slack, transport=httpx.MockTransport(engine))
    try:
        await h.slash("prod-a")
        await slack.until("chat.update")
        await h.bot.tasks.drain()
    finally:
        await h.close()
    said = "\n".join(json.dumps(c.args, ensure_ascii=False) for c in slack.calls)
    (finding,) = set(re.findall(r"vllm_metrics could not run: .*?(?=  _\()", said))
    assert as_quoted(finding, **{"10.0.0.5:8000": "HOST:PORT"}) in page()
    assert PAGES  # the harness's usual engine pages are vLLM's: this one is not


async def canary(base_url: str, *extra: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "latency_checker", "--endpoint", f"{base_url}/v1/completions",
        "--concurrency", "1", "--num-requests", "2", *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=ROOT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return process.returncode, out.decode()


@pytest.mark.parametrize("given", [True, False], ids=["metrics-url", "discovered"])
async def test_a_metrics_page_that_is_not_vllms_reads_as_quoted_from_the_canary(
    given: bool,
) -> None:
    async with SseEngine(metrics_pages=[NOT_VLLM]) as engine:
        extra = ["--metrics-url", f"{engine.base_url}/metrics"] if given else []
        code, out = await canary(engine.base_url, *extra)
        hostport = engine.base_url.removeprefix("http://")
    prefix = "error: " if given else "warning: "
    (line,) = {ln for ln in out.splitlines() if ln.startswith(prefix)}  # said before and after
    assert code == (2 if given else 0), out
    assert as_quoted(line, **{hostport: "HOST:PORT"}) in page()
