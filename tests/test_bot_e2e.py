"""End to end with real processes: a vLLM engine, Prometheus with the shipped rules, Alertmanager,
and `ruleloop serve`; only Slack is faked (at the wire).

Load on the engine (more streams than its --max-num-seqs, so requests queue) makes the TTFT rule
fire; the fake Slack must receive one incident thread whose numbers come from that engine, and
the resolved notification must update the same root message. The rules are the shipped ones,
test-sized: `for: 0s` and 15 s rate windows, so the alert resolves seconds after the load stops.
"""

from __future__ import annotations

import asyncio
import json
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

from bot.engine.process import free_port
from bot.store import service as store
from bot.store.db import Database
from tests.conftest import EngineFactory
from tests.fakes.slack_api import BOT_TOKEN, SIGNING_SECRET, FakeSlack

ROOT = Path(__file__).parent.parent
RULES = ROOT / "deploy" / "prometheus" / "vllm-alerts.rules.yml"
TOKEN = "e2e-alertmanager-token"
pytestmark = [pytest.mark.engine, pytest.mark.slow]


def sized_for_tests(rules: str) -> str:
    """The shipped rules with `for: 0s` and 15 s rate windows."""
    return re.sub(r"\[(5m|10m)\]", "[15s]", re.sub(r"for: \S+", "for: 0s", rules))


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
    engine = engine_factory(["--max-num-seqs", "2"])
    procs: list[Process] = []
    with FakeSlack() as slack:
        try:
            bot_port, am_port, prom_port = free_port(), free_port(), free_port()
            config = tmp_path / "ruleloop.toml"
            config.write_text(
                f'[slack]\nchannel = "#incidents"\n[paths]\nrunbooks = "{ROOT / "runbooks"}"\n'
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
                    "from bot.cli import main; main()",
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
            (tmp_path / "rules.yml").write_text(sized_for_tests(RULES.read_text()))
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
            }
        finally:
            for proc in reversed(procs):
                proc.stop()


async def load(base_url: str, stop: asyncio.Event, *, streams: int = 8) -> int:
    """Streams that outnumber the engine's sequences until ``stop``; every third one abandoned."""
    sent = 0

    async def worker(n: int) -> None:
        nonlocal sent
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            while not stop.is_set():
                sent += 1
                body = {
                    "model": "tiny-llama",
                    "prompt": "incident " * 25,
                    "max_tokens": 48,
                    "ignore_eos": True,
                    "stream": True,
                }
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    chunks = 0
                    async for _ in response.aiter_lines():
                        chunks += 1
                        if (sent + n) % 3 == 0 and chunks > 8:
                            break  # the client gives up: the engine aborts the request

    await asyncio.gather(*(worker(n) for n in range(streams)))
    return sent


async def test_alert_to_diagnosis_thread_and_resolution(stack: dict[str, object]) -> None:
    slack: FakeSlack = stack["slack"]  # type: ignore[assignment]
    engine = stack["engine"]
    stop = asyncio.Event()
    load_task = asyncio.create_task(load(engine.base_url, stop))  # type: ignore[attr-defined]
    try:
        await slack.until("chat.update", timeout=300)  # fired, routed, diagnosed under load
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
    updates = await slack.until("chat.update", 2, timeout=300)
    assert updates[-1].args["ts"] == diagnosed.args["ts"]
    assert ":white_check_mark: Resolved:" in updates[-1].args["text"]
    replies = slack.of("chat.postMessage")[1:]
    assert replies and all(r.args["thread_ts"] == diagnosed.args["ts"] for r in replies)
    assert len(slack.of("files.completeUploadExternal")) == 1
    db = Database(f"sqlite:///{stack['state']}/ruleloop.db")  # type: ignore[operator]
    try:
        with db.transaction() as s:
            incidents = store.incidents(s)
            trail = store.audit_trail(s)
            summary = incidents[0].summary
    finally:
        db.dispose()
    assert (
        len(incidents) == 1 and incidents[0].status == "resolved" and incidents[0].target == "tiny"
    )
    # the numbers come from the engine under load: TTFT over the alert line, tokens counted
    headline = summary["headline"]
    assert headline["ttft_p99_ms"] is not None and headline["ttft_p99_ms"] > 1000
    assert headline["goodput_ratio"] is not None and 0 < headline["goodput_ratio"] <= 1
    finished = next(e for e in trail if e.action == "diagnosis.finished")
    readings = finished.detail["readings"]
    assert readings["vllm_metrics.requests_finished"] > 0
    assert readings["queue_cancel.queue_time_p99_ms"] > 0  # requests queued behind 2 sequences
    assert readings["prometheus.ttft_p99_s_max"] > 1  # the real Prometheus saw what fired
    assert readings["nvml.gpu_count"] == 0  # no GPU here: a finding, not a failure
    posted = next(e for e in trail if e.action == "diagnosis.posted")
    print(
        f"\nwebhook -> diagnosis posted, excluding the {posted.detail['sampling_s']} s window: "
        f"{posted.detail['latency_s'] * 1000:.0f} ms; timings {finished.detail['timings_s']}; "
        f"headline {headline}; matches {finished.detail['matches']}"
    )
    lifecycle = [e.action for e in trail if e.action in ("incident.opened", "incident.resolved")]
    assert lifecycle == ["incident.opened", "incident.resolved"]
