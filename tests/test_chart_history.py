"""The chart with history: a real Prometheus holds half an hour of an engine's TPOT rising, the
bot diagnoses an alert through the shipped runbook's queries, and the chart and findings show
the history of the incident's metric (the matched ADR's: TPOT), the alert's start and the
sampling window. Slack is faked at the wire; the engine's /metrics are recorded pages.

The history is written in advance (promtool blocks), so the times are the test's own: TPOT
starts to rise at 19:02, the alert fires at 19:10, the bot diagnoses at 19:15.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from PIL import Image

from bot.diagnosis.chart_data import ChartData
from bot.diagnosis.history import describe
from bot.kernel.store.models import Incident
from tests.fakes import alerts
from tests.fakes.bot import ROOT, Harness, adr_dir, engine_transport, harness
from tests.fakes.prometheus_history import openmetrics, prometheus_with
from tests.fakes.slack_api import FakeSlack

END = dt.datetime(2026, 11, 29, 19, 15, tzinfo=dt.UTC).timestamp()
ONSET = dt.datetime(2026, 11, 29, 19, 2, tzinfo=dt.UTC).timestamp()
ALERT = "2026-11-29T19:10:00Z"
INSTANCE = "10.0.0.5:8000"
TPOT = "vllm:request_time_per_output_token_seconds_bucket"
BOUNDS = ("0.01", "0.025", "0.05", "0.075", "0.1", "+Inf")
SHIPPED = yaml.safe_load((ROOT / "runbooks" / "vllm-latency.yaml").read_text())
QUERIES: dict[str, str] = next(
    p["params"]["queries"] for p in SHIPPED["probes"] if p["probe"] == "prometheus"
)
TPOT_ADR_MATCH = "match:\n- metric: tpot_p99_ms\n  op: '>'\n  value: 1.0\n"
pytestmark = pytest.mark.slow


def history() -> str:
    """40 minutes, a scrape every 15 s: 20 requests finish per scrape, each with a TPOT of
    10-25 ms until 19:02; from then a growing share (all of them by 19:09) takes 25-50 ms, and
    requests start to queue."""
    tpot: dict[str, list[tuple[float, float]]] = {le: [] for le in BOUNDS}
    waiting = []
    slow = fast = 0
    t = END - 40 * 60
    while t <= END:
        share = 0.0 if t < ONSET else min(1.0, (t - ONSET) / (7 * 60))
        slow += round(20 * share)
        fast += 20 - round(20 * share)
        for le in BOUNDS:
            count = 0 if le == "0.01" else (fast if le == "0.025" else fast + slow)
            tpot[le].append((t, float(count)))
        waiting.append((t, float(round(12 * share))))
        t += 15
    series: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {
        (TPOT, (("instance", INSTANCE), ("le", le))): points for le, points in tpot.items()
    }
    series[("vllm:num_requests_waiting", (("instance", INSTANCE),))] = waiting
    return openmetrics(series)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with prometheus_with(history(), tmp_path_factory.mktemp("prometheus")) as url:
        yield url


class Routed(httpx.AsyncBaseTransport):
    """The engine's recorded /metrics pages, and the real Prometheus for its own address."""

    def __init__(self, prometheus: str) -> None:
        self._prometheus = httpx.URL(prometheus)
        self._engine = engine_transport()
        self._real = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if (url.host, url.port) == (self._prometheus.host, self._prometheus.port):
            return await self._real.handle_async_request(request)
        return await self._engine.handle_async_request(request)

    async def aclose(self) -> None:
        await self._real.aclose()


def bot_with(
    tmp_path: Path, slack: FakeSlack, prometheus: str, *, queries: dict[str, str],
    vllm_url: str = f"http://{INSTANCE}",
) -> Harness:  # fmt: skip
    """A bot whose runbook reads the engine's window and Prometheus's history (``queries``),
    with an accepted ADR matching on TPOT; its wall clock is 19:15."""
    runbooks = tmp_path / "history-runbooks"
    runbooks.mkdir()
    runbook = {
        "name": "test-history",
        "probes": [
            {"probe": "vllm_metrics", "params": {"window_s": 2, "interval_s": 1}},
            {"probe": "queue_cancel", "params": {"window_s": 2, "interval_s": 1}},
            {"probe": "prometheus", "params": {"minutes": 30, "step_s": 30, "queries": queries}},
        ],
        "findings": [{"when": "vllm_metrics.tpot_p99_ms > 1", "severity": "warning",
                      "message": "TPOT p99 is {value:.1f} ms"}],
    }  # fmt: skip
    (runbooks / "history.yaml").write_text(yaml.safe_dump(runbook))
    adrs = tmp_path / "tpot-adr"  # the seed ADR, matching on TPOT
    adrs.mkdir()
    seed = next(adr_dir(tmp_path, matching=False).glob("ADR-20260831-01-*.md"))
    text = seed.read_text()
    start = text.index("match:\n")
    end = text.index("fix:\n", start)
    (adrs / seed.name).write_text(text[:start] + TPOT_ADR_MATCH + text[end:])
    return harness(
        tmp_path, slack=slack, transport=Routed(prometheus),
        bot_options={"wall_clock": lambda: END},
        paths={"runbooks": str(runbooks), "adr": str(adrs)},
        targets={"prod-a": {"vllm_url": vllm_url, "prometheus_url": prometheus,
                            "actuator": {"kind": "dry-run"}}},
    )  # fmt: skip


@pytest.fixture
async def diagnosed(
    tmp_path: Path, slack: FakeSlack, prometheus: str
) -> AsyncIterator[tuple[Harness, dict[str, Any]]]:
    h = bot_with(tmp_path, slack, prometheus, queries=QUERIES)
    try:
        summary = await diagnose(h)
        yield h, summary
    finally:
        await h.close()


async def diagnose(h: Harness) -> dict[str, Any]:
    """An alert that started at 19:10, diagnosed; the stored summary."""
    alert = alerts.alert(starts_at=ALERT, instance=INSTANCE, ruleloop_target="prod-a")
    response = await h.webhook(alerts.body(alert))
    assert response.status_code == 202, response.text
    await h.bot.tasks.drain()
    with h.bot.db.transaction() as s:
        incident = s.get(Incident, response.json()["incident"])
        assert incident is not None
        return incident.summary.json_dict()


def prometheus_says(prometheus: str, name: str) -> list[tuple[float, float]]:
    """The shipped query, asked of Prometheus directly over the probe's range."""
    query = QUERIES[name].replace("$instance", INSTANCE)
    answer = httpx.get(
        f"{prometheus}/api/v1/query_range",
        params={"query": query, "start": END - 1800, "end": END, "step": 30},
    ).json()
    (result,) = answer["data"]["result"]
    return [(float(t), float(v)) for t, v in result["values"]]


def png_size(slack: FakeSlack) -> tuple[int, int]:
    (upload,) = slack.of("upload")
    return Image.open(io.BytesIO(upload.body)).size


async def test_the_chart_shows_the_incident_metrics_history_and_the_findings_say_when_it_began(
    diagnosed: tuple[Harness, dict[str, Any]], slack: FakeSlack, prometheus: str
) -> None:
    _, summary = diagnosed
    chart = summary["chart"]
    assert (chart["metric"], chart["history_query"]) == ("tpot_p99_ms", "tpot_p99_s")
    # the history is Prometheus's own answer, in ms, and the queue's beside it
    truth = prometheus_says(prometheus, "tpot_p99_s")
    assert [(t, round(v, 6)) for t, v in chart["history"]] == [
        (t, round(v * 1000, 6)) for t, v in truth
    ]
    assert [v for _, v in chart["history_waiting"]] == [
        v for _, v in prometheus_says(prometheus, "waiting")
    ]
    assert chart["alert_start"] == dt.datetime.fromisoformat(ALERT).timestamp()
    assert chart["window_end"] == END and END - chart["window_start"] == pytest.approx(2.0)
    assert (chart["gate"], chart["gate_adr"]) == (35.0, "ADR-20260831-01")  # the ADR's TPOT gate
    # what the history shows: from the level before, to the peak, when it began, and the alert
    (line,) = [m for _, m, source in summary["findings"] if source == "prometheus history"]
    found = re.fullmatch(
        r"TPOT p99 rose from (\S+) ms to (\S+) ms starting 19:(\d\d) UTC, (\d+) min before the "
        r"alert \(peak at 19:\d\d UTC; Prometheus, last 30 min\)",
        line,
    )
    assert found, line
    before, peak, minute, lead = found.groups()
    assert float(before) == round(truth[0][1] * 1000, 1)  # steady until the rise
    assert float(peak) == round(max(v for _, v in truth) * 1000, 1)
    assert 2 <= int(minute) <= 4  # the rise began at 19:02; a 2 min rate() sees it by 19:04
    assert int(lead) == 10 - int(minute)
    # Slack: the finding in the thread, then the two-panel chart named for TPOT
    replies = json.dumps([c.args for c in slack.of("chat.postMessage")], ensure_ascii=False)
    assert line in replies
    (asked,) = slack.of("files.getUploadURLExternal")
    assert asked.args["filename"] == "incident-1-tpot-queue.png"
    (done,) = slack.of("files.completeUploadExternal")
    assert "prod-a: TPOT p99 and queue depth, last 30 min" in json.dumps(done.args)
    assert png_size(slack) == (1000, 440)  # history beside the window


async def test_without_a_query_for_the_incidents_metric_the_finding_says_which_to_add(
    tmp_path: Path, slack: FakeSlack, prometheus: str
) -> None:
    h = bot_with(tmp_path, slack, prometheus, queries={"ttft_p99_s": QUERIES["ttft_p99_s"]})
    try:
        summary = await diagnose(h)
    finally:
        await h.close()
    assert summary["chart"]["metric"] == "tpot_p99_ms" and summary["chart"]["history"] == []
    (line,) = [m for _, m, source in summary["findings"] if source == "prometheus history"]
    assert "has no `tpot_p99_ms` or `tpot_p99_s` query" in line
    assert png_size(slack) == (800, 420)  # the sampling window alone


async def test_a_target_prometheus_has_no_history_of_gets_no_history(
    tmp_path: Path, slack: FakeSlack, prometheus: str
) -> None:
    h = bot_with(tmp_path, slack, prometheus, queries=QUERIES, vllm_url="http://10.0.0.9:8000")
    try:
        summary = await diagnose(h)
    finally:
        await h.close()
    assert summary["chart"]["history"] == []
    (line,) = [m for _, m, source in summary["findings"] if source == "prometheus history"]
    assert line == "Prometheus returned no points for the runbook's `tpot_p99_s` query"


def chart_with(history: list[tuple[float, float | None]], *, alert: float | None) -> ChartData:
    """Chart data of a TPOT incident whose Prometheus history is ``history`` (ms)."""
    return ChartData(
        target="prod-a", metric="tpot_p99_ms", window=[], waiting=[], window_start=END - 10,
        window_end=END, history=history, history_query="tpot_p99_s", alert_start=alert,
    )  # fmt: skip


def minutes(start: float, values: list[float | None]) -> list[tuple[float, float | None]]:
    """One point a minute from ``start``."""
    return [(start + 60 * i, v) for i, v in enumerate(values)]


def test_history_that_does_not_rise_says_so() -> None:
    flat = minutes(END - 1800, [12.0, 12.5, 11.8, 12.2] * 7 + [12.1, 12.0])
    (finding,) = describe(chart_with(flat, alert=None))
    assert finding.message == (
        "TPOT p99 stayed between 11.8 ms and 12.5 ms over the last 30 min: no rise inside the "
        "history"
    )
    high_all_along = minutes(END - 1800, [45.0] + [41.0] * 29)  # began before the history
    (finding,) = describe(chart_with(high_all_along, alert=None))
    assert "no rise inside the history" in finding.message


def test_a_rise_after_the_alert_and_a_rise_without_an_alert() -> None:
    start = END - 1800  # 18:45
    rising = minutes(start, [None, 10.0, 10.0, 10.0] + [10.0] * 16 + [30.0] * 5 + [40.0] * 5)
    (after,) = describe(chart_with(rising, alert=start + 60 * 15))  # fired 19:00, rise 19:05
    assert after.message.startswith(
        "TPOT p99 rose from 10.0 ms to 40.0 ms starting 19:05 UTC, 5 min after the alert fired"
    )
    (alone,) = describe(chart_with(rising, alert=None))  # a /diagnose: no alert to place
    assert alone.message.startswith("TPOT p99 rose from 10.0 ms to 40.0 ms starting 19:05 UTC (")


def test_too_little_history_is_not_read() -> None:
    (finding,) = describe(chart_with(minutes(END - 120, [10.0, None, 50.0]), alert=None))
    assert finding.message == "Prometheus has 2 point(s) of TPOT p99 history: too few to read"
