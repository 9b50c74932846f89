"""Webhook received -> diagnosis posted, excluding the sampling window.

    python bench/bot_latency_bench.py [--incidents 20] [--window 1] [--engine-url URL]
                                      [--earlier 500]

Runs `ruleloop serve`'s app in this process behind uvicorn (real HTTP), a fake Slack Web API
(tests/fakes/slack_api.py, a real local HTTP server) and, unless --engine-url names a live
vLLM engine, a server that replays recorded vLLM /metrics pages. Sends one Alertmanager
notification per incident, one at a time, and measures:
  bot side     the bot's own measurement (audit `diagnosis.posted` latency_s): handler entry ->
               root message updated, minus the sampling window the runbook asked for;
  client side  POST sent -> the fake Slack received the root message's chat.update, minus the
               sampling window: includes HTTP, the intake transaction and every Slack call.
With --earlier N, the run is made twice, the peer first: on an empty store, then on a store
that already holds N earlier incidents on the target, each supporting every built-in cause and
half of them with a change kept, plus the drift job's entries (the memory's lookup reads up to
500 of them: bot/incidents/memory.py). Both runs judge the runbook's hypotheses; the second
also recalls. `bot_side_ms` is the work beyond the window: issue 33's "sampling window plus
1 s of work".
Results: bench/results/bot_latency_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from sqlalchemy import select  # noqa: E402

from bot.adr.causes import BUILTIN  # noqa: E402
from bot.app.server import Bot, create_bot  # noqa: E402
from bot.engine.process import free_port  # noqa: E402
from bot.incidents import memory  # noqa: E402
from bot.kernel.config import Settings  # noqa: E402
from bot.kernel.store import service as store  # noqa: E402
from bot.kernel.store.models import Incident, Remediation  # noqa: E402
from tests import store_reads  # noqa: E402
from tests.fakes.alerts import alert, body  # noqa: E402
from tests.fakes.bot import PAGES  # noqa: E402
from tests.fakes.metrics_server import RecordedMetrics  # noqa: E402
from tests.fakes.nvml import FakeNvml  # noqa: E402
from tests.fakes.slack_api import BOT_TOKEN, SIGNING_SECRET, FakeSlack  # noqa: E402

RESULTS = ROOT / "bench" / "results"
TOKEN = "bench-token-0123456789abcdef"


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


def seed_earlier(bot: Bot, n: int) -> None:
    """N earlier incidents on the bench target, each supporting every built-in cause (so the
    memory reads all of them back); every other one with a change kept, and a drift entry."""
    now = dt.datetime.now(dt.UTC)
    causes = [{"cause": c, "title": c, "verdict": "supported", "evidence": "", "number": "1",
               "missing": []} for c in BUILTIN]  # fmt: skip
    with bot.db.transaction() as s:
        for i in range(n):
            at = now - dt.timedelta(hours=n - i)
            made = store.create(s, key=f"earlier-{i}", source="alertmanager", title="earlier",
                                target="bench", labels={}, at=at, status="resolved")  # fmt: skip
            store.set_summary(s, made, summary={"causes": causes, "matches": ["ADR-X"]})
            s.flush()
            if i % 2:
                s.add(Remediation(incident_id=made.id, adr_id="ADR-X", target="bench",
                                  requested_by="U1", state="promoted", approvals_needed=1,
                                  approved_by=["U2"], created_at=at, updated_at=at))  # fmt: skip
            store.audit(
                s,
                at=at,
                actor="ruleloop",
                action="workload.drift",
                incident=made,
                detail={"dimensions": {"ADR-X": ["prompt p50: 2,000 -> 500 tokens"]}},
            )


def timed(owner: object, name: str) -> list[float]:
    """Wrap ``owner.name`` (a coroutine method) to note each call's duration in ms."""
    taken: list[float] = []
    method = getattr(owner, name)

    async def wrapper(*args: object, **kwargs: object) -> object:
        started = time.perf_counter()
        try:
            return await method(*args, **kwargs)
        finally:
            taken.append((time.perf_counter() - started) * 1000)

    setattr(owner, name, wrapper)
    return taken


def time_recall(bot: Bot, repeat: int = 20) -> float:
    """The memory's lookup alone (bot.incidents.memory.recall), for a summary supporting every
    built-in cause, on the seeded store: the median of ``repeat`` runs, in ms."""
    taken = []
    with bot.db.transaction() as s:
        latest = s.scalars(select(Incident).order_by(Incident.id.desc())).first()
        assert latest is not None
        summary = {"causes": [{"cause": c, "verdict": "supported"} for c in BUILTIN]}
        for _ in range(repeat):
            started = time.perf_counter()
            memory.recall(s, latest, summary)
            taken.append((time.perf_counter() - started) * 1000)
    return statistics.median(taken)


async def main(args: argparse.Namespace, earlier: int = 0) -> dict[str, object]:
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
        seed_earlier(bot, earlier)
        remember_ms = timed(bot.flows._records, "remember")  # the memory's part of the work
        diagnose_ms = timed(bot.flows._diagnoser, "diagnose")  # window + runbook + ADRs + causes
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(bot.app, port=port, log_level="warning", lifespan="on")
        )
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.05)
        client_side: list[float] = []
        instance = engine_url.removeprefix("http://")
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for i in range(args.incidents):
                raw = body(
                    alert(instance=instance, fingerprint=f"{i:016x}"), group_key=f"bench-{i}"
                )
                updates = len(slack.of("chat.update"))  # the resolutions update the root too
                started = time.monotonic()
                response = await client.post("/alertmanager", content=raw, headers=headers)
                assert response.status_code == 202, response.text
                await slack.until("chat.update", updates + 1, timeout=120)
                client_side.append(time.monotonic() - started)
                # the chart follows the numbers; let it finish so incidents do not overlap
                await slack.until("files.completeUploadExternal", i + 1, timeout=120)
                # resolved: the next alert on this one engine opens a new incident
                done = body(alert(instance=instance, fingerprint=f"{i:016x}", status="resolved"),
                            group_key=f"bench-{i}")  # fmt: skip
                response = await client.post("/alertmanager", content=done, headers=headers)
                assert response.status_code == 202, response.text
                await slack.until("chat.update", updates + 2, timeout=120)
        server.should_exit = True
        await serving
        recall_ms = time_recall(bot) if earlier else None
        with bot.db.transaction() as s:
            trail = store_reads.audit_trail(s)
            posted = [e.detail for e in trail if e.action == "diagnosis.posted"]
            finished = [e.detail for e in trail if e.action == "diagnosis.finished"]
    timings = [d["timings_s"] for d in finished]
    supported = sorted({c["cause"] for d in finished for c in d.get("causes", [])
                        if c["verdict"] == "supported"})  # fmt: skip
    bot_side = [d["latency_s"] for d in posted]
    sampling = [d["sampling_s"] for d in posted]
    client_net = [c - w for c, w in zip(client_side, sampling, strict=True)]
    result = {
        "incidents": args.incidents,
        "earlier_incidents": earlier,
        "supported_causes": supported,
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
        "recall_every_cause_ms_p50": recall_ms,
        "remember_ms": {k: pct(remember_ms, q) for k, q in (("p50", 0.5), ("max", 1.0))},
        "diagnose_beyond_sampling_ms_p50": statistics.median(
            d - w * 1000 for d, w in zip(diagnose_ms, sampling, strict=True)
        ),
    }
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--incidents", type=int, default=20)
    parser.add_argument("--window", type=float, default=1.0, help="sampling window, seconds")
    parser.add_argument(
        "--engine-url", default=None, help="a live vLLM engine instead of recorded pages"
    )
    parser.add_argument(
        "--earlier", type=int, default=0, help="also run on a store with N earlier incidents"
    )
    args = parser.parse_args()
    result: dict[str, object] = {
        "cpu": platform.processor() or platform.machine(),
        "load_average": os.getloadavg(),
        "runs": [asyncio.run(main(args))],
    }
    if args.earlier:
        runs = result["runs"]
        assert isinstance(runs, list)
        runs.append(asyncio.run(main(args, earlier=args.earlier)))
        result["bot_side_p50_ratio_with_earlier"] = (
            runs[1]["bot_side_ms"]["p50"] / runs[0]["bot_side_ms"]["p50"]
        )
    result["load_average_after"] = os.getloadavg()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bot_latency_bench.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
