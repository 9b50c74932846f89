"""Webhook received -> diagnosis posted, excluding the sampling window.

    python bench/bot_latency_bench.py [--incidents 20] [--window 1] [--engine-url URL]

Runs `ruleloop serve`'s app in this process behind uvicorn (real HTTP), a fake Slack Web API
(tests/fakes/slack_api.py, a real local HTTP server) and, unless --engine-url names a live
vLLM engine, a server that replays recorded vLLM /metrics pages. Sends one Alertmanager
notification per incident, one at a time, and measures:
  bot side     the bot's own measurement (audit `diagnosis.posted` latency_s): handler entry ->
               root message updated, minus the sampling window the runbook asked for;
  client side  POST sent -> the fake Slack received the root message's chat.update, minus the
               sampling window: includes HTTP, the intake transaction and every Slack call.
Results: bench/results/bot_latency_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import uvicorn  # noqa: E402

from bot.config import Settings  # noqa: E402
from bot.engine.process import free_port  # noqa: E402
from bot.server import create_bot  # noqa: E402
from tests import store_reads  # noqa: E402
from tests.fakes.alerts import alert, body  # noqa: E402
from tests.fakes.bot import PAGES  # noqa: E402
from tests.fakes.metrics_server import RecordedMetrics  # noqa: E402
from tests.fakes.nvml import FakeNvml  # noqa: E402
from tests.fakes.slack_api import BOT_TOKEN, SIGNING_SECRET, FakeSlack  # noqa: E402

RESULTS = ROOT / "bench" / "results"
TOKEN = "bench-token"


def runbook(window: float) -> str:
    """The shipped latency runbook's probes and findings, with a bench-sized window."""
    text = (ROOT / "runbooks" / "vllm-latency.yaml").read_text()
    text = text.replace(
        "{window_s: 10, interval_s: 1}", f"{{window_s: {window}, interval_s: {window / 2}}}"
    )
    assert f"window_s: {window}" in text
    # no Prometheus here: drop that probe (it would only report "no prometheus_url")
    head, _, rest = text.partition("  - probe: prometheus\n")
    return head + "findings:" + rest.split("findings:", 1)[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main(args: argparse.Namespace) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="ruleloop-bench-"))
    (tmp / "runbooks").mkdir()
    (tmp / "runbooks" / "latency.yaml").write_text(runbook(args.window))
    with FakeSlack() as slack, RecordedMetrics(PAGES) as recorded:
        engine_url = args.engine_url or recorded.base_url
        settings = Settings.model_validate(
            {
                "slack": {
                    "bot_token": BOT_TOKEN,
                    "signing_secret": SIGNING_SECRET,
                    "api_url": slack.api_url,
                },
                "targets": {"bench": {"vllm_url": engine_url}},
                "alertmanager": {"token": TOKEN},
                "paths": {"runbooks": str(tmp / "runbooks"), "adr": str(ROOT / "adr")},
            }
        )
        bot = create_bot(settings, state_dir=tmp / "state", nvml=FakeNvml.no_driver())
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(bot.app, port=port, log_level="warning", lifespan="on")
        )
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.05)
        client_side: list[float] = []
        instance = engine_url.removeprefix("http://")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for i in range(args.incidents):
                raw = body(
                    alert(instance=instance, fingerprint=f"{i:016x}"), group_key=f"bench-{i}"
                )
                started = time.monotonic()
                response = await client.post(
                    "/alertmanager",
                    content=raw,
                    headers={
                        "Authorization": f"Bearer {TOKEN}",
                        "Content-Type": "application/json",
                    },
                )
                assert response.status_code == 202, response.text
                await slack.until("chat.update", i + 1, timeout=120)
                client_side.append(time.monotonic() - started)
                # the chart follows the numbers; let it finish so incidents do not overlap
                await slack.until("files.completeUploadExternal", i + 1, timeout=120)
        server.should_exit = True
        await serving
        with bot.db.transaction() as s:
            trail = store_reads.audit_trail(s)
            posted = [e.detail for e in trail if e.action == "diagnosis.posted"]
            timings = [e.detail["timings_s"] for e in trail if e.action == "diagnosis.finished"]
    bot_side = [d["latency_s"] for d in posted]
    sampling = [d["sampling_s"] for d in posted]
    client_net = [c - w for c, w in zip(client_side, sampling, strict=True)]
    result = {
        "incidents": args.incidents,
        "window_s": args.window,
        "engine": "live" if args.engine_url else "recorded vLLM 0.32.0 pages",
        "bot_side_ms": {
            k: pct(bot_side, q) * 1000 for k, q in (("p50", 0.5), ("p90", 0.9), ("max", 1.0))
        },
        "client_side_ms": {
            k: pct(client_net, q) * 1000 for k, q in (("p50", 0.5), ("p90", 0.9), ("max", 1.0))
        },
        "sampling_s_mean": statistics.fmean(sampling),
        "runbook_beyond_sampling_ms_p50": statistics.median(
            (t["runbook_s"] - w) * 1000 for t, w in zip(timings, sampling, strict=True)
        ),
        "adrs_ms_p50": statistics.median(t["adrs_s"] * 1000 for t in timings),
        "slack_calls_per_incident": len(slack.calls) / args.incidents,
    }
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--incidents", type=int, default=20)
    parser.add_argument("--window", type=float, default=1.0, help="sampling window, seconds")
    parser.add_argument(
        "--engine-url", default=None, help="a live vLLM engine instead of recorded pages"
    )
    result = asyncio.run(main(parser.parse_args()))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bot_latency_bench.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
