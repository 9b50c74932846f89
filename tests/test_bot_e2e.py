"""End to end with real processes: a vLLM engine, Prometheus with the shipped rules, Alertmanager,
and `ruleloop serve`; only Slack is faked (at the wire).

The TTFT alert line is built from this engine, not from a clock: requests alone are measured
first, and the line (in the rules and the runbooks) is the histogram bound at or below the time
the engine takes to decode one of them. The load then runs 12 streams on an engine of 2
sequences, so a new request waits in vLLM's queue behind several others' decoding and its TTFT
is above the line on a machine of any speed. The fake Slack must receive one incident thread whose numbers come from
that engine, and the resolved notification must update the same root message. The rules are the
shipped ones, test-sized: `for: 0s` and 15 s rate windows, so the alert resolves seconds after
the load stops.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bot.diagnosis.probes.exposition import Exposition
from bot.engine.process import EngineInfo, free_port
from bot.kernel.store.db import Database
from tests import store_reads
from tests.conftest import EngineFactory
from tests.fakes.slack_api import BOT_TOKEN, SIGNING_SECRET, FakeSlack

ROOT = Path(__file__).parent.parent
RULES = ROOT / "deploy" / "prometheus" / "vllm-alerts.rules.yml"
RUNBOOKS = ROOT / "runbooks"
TOKEN = "e2e-alertmanager-token"
SEQS = 2  # the engine's --max-num-seqs
STREAMS = 12  # load streams: 6 per sequence, so most requests queue behind others
ANSWER, GIVE_UP = 128, 80  # tokens per answer, and when every third client leaves (see load)
PROMPT = "incident " * 25
pytestmark = [pytest.mark.engine, pytest.mark.slow]


def sized_for_tests(rules: str, *, ttft_line_s: float) -> str:
    """The shipped rules with `for: 0s`, 15 s rate windows and the TTFT alert line given."""
    rules = re.sub(r"\[(5m|10m)\]", "[15s]", re.sub(r"for: \S+", "for: 0s", rules))
    head, name, tail = rules.partition("alert: VLLMTimeToFirstTokenP99High")
    tail, replaced = re.subn(r"\)\) > 1\n", f")) > {ttft_line_s!r}\n", tail, count=1)
    assert name and replaced == 1, "the shipped TTFT rule no longer reads `)) > 1`"
    return head + name + tail


ENDED = 45  # requests the diagnosis window should see end, for a goodput within its bounds


def window_for(alone_s: float) -> float:
    """The diagnosis window, from the engine's measured speed: long enough for ENDED requests to
    end under load, at the least rate the load can run (SEQS slots, each step at most SEQS times
    slower than alone: one request per ``alone_s``, a request's TTFT + decode alone). Goodput is
    read from what ended in the window, against the tokens in flight at its ends (a few blocks
    each): 30 finished against those reads within 20 points, where a 10 s window on a slow
    machine saw 6 finish and the goodput was unknown. At least the shipped 10 s, at most the
    probe's 600 s."""
    return min(600.0, max(10.0, math.ceil(ENDED * alone_s)))


def runbooks_with_ttft_line(target: Path, line_ms: float, window_s: float) -> Path:
    """The shipped runbooks, copied with the TTFT finding at ``line_ms`` instead of 1000 ms
    and the engine's sampling window ``window_s`` instead of 10 s."""
    target.mkdir()
    for path in RUNBOOKS.glob("*.yaml"):
        text = path.read_text()
        assert "vllm_metrics.ttft_p99_ms > 1000" in text, path
        text = text.replace(
            "vllm_metrics.ttft_p99_ms > 1000", f"vllm_metrics.ttft_p99_ms > {line_ms!r}"
        )
        (target / path.name).write_text(text.replace("{window_s: 10,", f"{{window_s: {window_s},"))
    return target


def scrape(engine: EngineInfo) -> Exposition:
    return Exposition.parse(httpx.get(f"{engine.base_url}/metrics", timeout=10).text, at=0.0)


def mean_s(before: Exposition, after: Exposition, histogram: str) -> float:
    """Mean of the observations a histogram gained between two scrapes."""
    count = (after.total(f"{histogram}_count") or 0) - (before.total(f"{histogram}_count") or 0)
    total = (after.total(f"{histogram}_sum") or 0) - (before.total(f"{histogram}_sum") or 0)
    assert count > 0, f"the engine observed no {histogram}"
    return total / count


def alone(engine: EngineInfo) -> tuple[float, float]:
    """Mean TTFT and decode time (s) of three load requests, one at a time, after one more.

    Both from the engine's histograms. The decode time is the engine core's own clock from first
    to last token: a busy API server that delivers the stream late cannot shorten or stretch it.
    """
    with httpx.Client(base_url=engine.base_url, timeout=120) as client:
        for i in range(4):
            if i == 1:
                before = scrape(engine)
            with client.stream("POST", "/v1/completions", json=request_body()) as response:
                for _ in response.iter_lines():
                    pass
    after = scrape(engine)
    return (
        mean_s(before, after, "vllm:time_to_first_token_seconds"),
        mean_s(before, after, "vllm:request_decode_time_seconds"),
    )


def alert_line(engine: EngineInfo, below_s: float) -> float:
    """The largest bound of vLLM's TTFT histogram at or below ``below_s``.

    A quantile estimated from a histogram stays inside the bucket of the true quantile, so when
    the true TTFT p99 is above ``below_s`` both Prometheus and the bot read a value above a
    line on the bound below it, whatever the interpolation inside the bucket.
    """
    bounds = scrape(engine).buckets("vllm:time_to_first_token_seconds")
    assert bounds, "the engine exports no TTFT histogram"
    return max(b for b in bounds if b <= below_s)


def request_body() -> dict[str, object]:
    return {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": ANSWER, "ignore_eos": True,
            "stream": True}  # fmt: skip


class Process:
    """A started process, stopped (SIGTERM, then SIGKILL) by ``stop``."""

    def __init__(self, argv: list[str], *, log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._fh = log.open("w")
        self.proc = subprocess.Popen(
            argv, stdout=self._fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )

    def wait_ready(self, url: str, *, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.proc.args[0]} not ready:\n{self.log.read_text()[-3000:]}"
                )
            time.sleep(0.3)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._fh.close()
        return self.proc.returncode


@pytest.fixture
def stack(tmp_path: Path, engine_factory: EngineFactory) -> Iterator[dict[str, object]]:
    """Engine (max 2 sequences), fake Slack, ruleloop serve, Alertmanager, Prometheus."""
    engine = engine_factory(["--max-num-seqs", str(SEQS)])
    ttft_alone_s, decode_alone_s = alone(engine)
    line_s = alert_line(engine, decode_alone_s)
    window_s = window_for(ttft_alone_s + decode_alone_s)
    runbooks = runbooks_with_ttft_line(tmp_path / "runbooks", line_s * 1000, window_s)
    procs: list[Process] = []
    with FakeSlack() as slack:
        try:
            bot_port, am_port, prom_port = free_port(), free_port(), free_port()
            config = tmp_path / "ruleloop.toml"
            config.write_text(
                f'[slack]\nchannel = "#incidents"\n[paths]\nrunbooks = "{runbooks}"\n'
                f'adr = "{ROOT / "adr"}"\n[targets.tiny]\nvllm_url = "{engine.base_url}"\n'
                f'prometheus_url = "http://127.0.0.1:{prom_port}"\n'
            )
            env = {
                **os.environ,
                "RULELOOP_CONFIG": str(config),
                "SLACK_BOT_TOKEN": BOT_TOKEN,
                "SLACK_SIGNING_SECRET": SIGNING_SECRET,
                "SLACK_API_URL": slack.api_url,
                "RULELOOP_ALERTMANAGER_TOKEN": TOKEN,
            }
            env.pop("SLACK_APP_TOKEN", None)
            bot = Process(
                [
                    sys.executable,
                    "-c",
                    "from bot.app.cli import main; main()",
                    "serve",
                    "--port",
                    str(bot_port),
                    "--state-dir",
                    str(tmp_path / "state"),
                ],
                log=tmp_path / "serve.log",
                env=env,
            )
            procs.append(bot)
            (tmp_path / "am.yml").write_text(
                "route: {receiver: ruleloop, group_by: [instance], group_wait: 1s, "
                "group_interval: 2s, repeat_interval: 1h}\n"
                "receivers:\n- name: ruleloop\n  webhook_configs:\n"
                f"  - url: http://127.0.0.1:{bot_port}/alertmanager\n    send_resolved: true\n"
                f"    http_config: {{authorization: {{type: Bearer, credentials: {TOKEN}}}}}\n"
            )
            am = Process(
                [
                    "prometheus-alertmanager",
                    f"--config.file={tmp_path / 'am.yml'}",
                    f"--storage.path={tmp_path / 'am-data'}",
                    f"--web.listen-address=127.0.0.1:{am_port}",
                    "--cluster.listen-address=",
                ],
                log=tmp_path / "am.log",
            )
            procs.append(am)
            (tmp_path / "rules.yml").write_text(
                sized_for_tests(RULES.read_text(), ttft_line_s=line_s)
            )
            (tmp_path / "prometheus.yml").write_text(
                "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                f"rule_files: [{tmp_path / 'rules.yml'}]\n"
                f"alerting: {{alertmanagers: [{{static_configs: [{{targets: ['127.0.0.1:{am_port}']}}]}}]}}\n"
                "scrape_configs:\n- job_name: vllm\n  static_configs:\n"
                f"  - targets: ['127.0.0.1:{engine.port}']\n"
            )
            prom = Process(
                [
                    "prometheus",
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                    "--rules.alert.resend-delay=2s",
                ],
                log=tmp_path / "prometheus.log",
            )
            procs.append(prom)
            bot.wait_ready(f"http://127.0.0.1:{bot_port}/healthz")
            am.wait_ready(f"http://127.0.0.1:{am_port}/-/ready")
            prom.wait_ready(f"http://127.0.0.1:{prom_port}/-/ready")
            yield {
                "slack": slack,
                "engine": engine,
                "bot": bot,
                "state": tmp_path / "state",
                "prometheus": f"http://127.0.0.1:{prom_port}",
                "ttft_line_s": line_s,
                "alone_s": (ttft_alone_s, decode_alone_s),
                "window_s": window_s,
            }
        finally:
            for proc in reversed(procs):
                proc.stop()


async def load(base_url: str, stop: asyncio.Event) -> int:
    """STREAMS streams on SEQS sequences until ``stop``; every third client leaves mid-answer.

    Why TTFT crosses the line: a new request finds most of the other STREAMS - 1 queued ahead of
    it (at least 5 of 11, with 2 running), and vLLM serves its queue first come first served, so
    it waits while one sequence slot finishes at least two requests that started after it
    arrived, each decoding at least GIVE_UP - 1 tokens: 2 x 79 steps, more than the 127 steps of
    one request decoding alone (``alone``), whatever the machine's speed. Most find 9 ahead.
    """
    sent = 0

    async def worker() -> None:
        nonlocal sent
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            while not stop.is_set():
                sent += 1
                impatient = sent % 3 == 0
                async with client.stream(
                    "POST", "/v1/completions", json=request_body()
                ) as response:
                    tokens = 0
                    async for line in response.aiter_lines():
                        tokens += line.startswith("data:") and "[DONE]" not in line
                        if impatient and tokens >= GIVE_UP:
                            break  # the client gives up: the engine aborts the request

    await asyncio.gather(*(worker() for _ in range(STREAMS)))
    return sent


async def test_alert_to_diagnosis_thread_and_resolution(stack: dict[str, object]) -> None:
    slack: FakeSlack = stack["slack"]  # type: ignore[assignment]
    engine = stack["engine"]
    window_s: float = stack["window_s"]  # type: ignore[assignment]
    # Waits from measured speed: 5 minutes for the alert to fire and route, plus the window
    # twice over (a second alert of the incident may sample again); the load drains in-flight
    # requests before the resolution, at most STREAMS answers per slot.
    wait_s = 300 + 2 * window_s
    stop = asyncio.Event()
    load_task = asyncio.create_task(load(engine.base_url, stop))  # type: ignore[attr-defined]
    try:
        await slack.until("chat.update", timeout=wait_s)  # fired, routed, diagnosed under load
    finally:
        stop.set()
        sent = await load_task
    assert sent > 0
    root = slack.of("chat.postMessage")[0]
    assert root.args["channel"] == "#incidents" and root.args["text"].startswith(
        ":rotating_light: VLLM"
    )
    assert root.args["text"].endswith("· firing · target tiny")
    diagnosed = slack.of("chat.update")[0]
    numbers = json.dumps(diagnosed.args["blocks"], ensure_ascii=False)
    assert "*TTFT p99*" in numbers and "diagnosed" in numbers
    # resolution: the load stopped, the 15 s windows empty, Alertmanager sends resolved
    updates = await slack.until("chat.update", 2, timeout=wait_s)
    assert updates[-1].args["ts"] == diagnosed.args["ts"]
    assert ":white_check_mark: Resolved:" in updates[-1].args["text"]
    replies = slack.of("chat.postMessage")[1:]
    assert replies and all(r.args["thread_ts"] == diagnosed.args["ts"] for r in replies)
    assert len(slack.of("files.completeUploadExternal")) == 1
    db = Database(f"sqlite:///{stack['state']}/ruleloop.db")  # type: ignore[operator]
    try:
        with db.transaction() as s:
            incidents = store_reads.incidents(s)
            trail = store_reads.audit_trail(s)
            summary = incidents[0].summary.json_dict()
    finally:
        db.dispose()
    assert (
        len(incidents) == 1 and incidents[0].status == "resolved" and incidents[0].target == "tiny"
    )
    # the numbers come from the engine under load: TTFT over the alert line, tokens counted
    line_s: float = stack["ttft_line_s"]  # type: ignore[assignment]
    headline = summary["headline"]
    assert headline["ttft_p99_ms"] is not None and headline["ttft_p99_ms"] > line_s * 1000
    finished = next(e for e in trail if e.action == "diagnosis.finished")
    readings = finished.detail["readings"]
    assert headline["goodput_ratio"] is not None and 0 < headline["goodput_ratio"] <= 1, (
        readings.get("vllm_metrics.goodput_basis"), readings,
    )  # fmt: skip
    # ... and the thread's finding says so, with the first diagnosis's number and the runbook's
    # line (a second alert of the same incident, e.g. queue time on a loaded box, may diagnose
    # again and update the summary's headline)
    finding = (
        f"TTFT p99 is {readings['vllm_metrics.ttft_p99_ms']:.0f} ms, "
        f"over the {line_s * 1000:.0f} ms"
    )
    thread = [r.args.get("text", "") for r in replies]
    assert any(finding in json.dumps(r.args, ensure_ascii=False) for r in replies), (
        finding, thread, [e.action for e in trail],
    )  # fmt: skip
    assert readings["vllm_metrics.requests_finished"] > 0
    assert readings["queue_cancel.queue_time_p99_ms"] > 0  # requests queued behind SEQS sequences
    assert readings["prometheus.ttft_p99_s_max"] > line_s  # the real Prometheus saw it too
    assert readings["nvml.gpu_count"] == 0  # no GPU here: a finding, not a failure
    posted = next(e for e in trail if e.action == "diagnosis.posted")
    ttft_alone_s, decode_alone_s = stack["alone_s"]  # type: ignore[misc]
    print(
        f"\nalone: TTFT {ttft_alone_s * 1000:.0f} ms, decode {decode_alone_s * 1000:.0f} ms; "
        f"TTFT line {line_s * 1000:.0f} ms"
        f"\nwebhook -> diagnosis posted, excluding the {posted.detail['sampling_s']} s window: "
        f"{posted.detail['latency_s'] * 1000:.0f} ms; timings {finished.detail['timings_s']}; "
        f"headline {headline}; matches {finished.detail['matches']}"
    )
    lifecycle = [e.action for e in trail if e.action in ("incident.opened", "incident.resolved")]
    assert lifecycle == ["incident.opened", "incident.resolved"]
