"""Workload capture over a fleet: every replica's /metrics, scripted at the wire, read in the
same rounds and summed per engine process; per replica and per fleet compared like with like
(docs/workload.md, "Per replica or per fleet")."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from bot.adr.workload import shape as shapes
from bot.adr.workload.diff import diff
from bot.adr.workload.shape import WorkloadShape
from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.replicas import Replica
from bot.diagnosis.probes.vllm_metrics import MetricsScraper
from bot.diagnosis.probes.workload_capture import CAPTURE_METRICS, capture_fleet
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import FakeSlack
from tests.test_scheduler_workload_drift import ADR, ShapeCanary, record_workload
from tests.test_workload_prometheus import capture as prometheus_capture
from tests.test_workload_prometheus import prometheus as recorded_prometheus
from tests.workload_pages import CAPTURED_AT, chat, lengths, vllm_page, with_process

WINDOW_S, INTERVAL_S = 60.0, 5.0
ROUNDS = int(WINDOW_S / INTERVAL_S) + 1  # scrapes at 0, 5, ..., 60 s


class Engine:
    """One replica's vLLM: each scrape first finishes ``per_scrape`` requests (prompts of
    ``low``-``high`` tokens), then shows its counters since its process started."""

    def __init__(self, seed: int, *, per_scrape: int = 20, low: int = 64, high: int = 192) -> None:
        self.per_scrape, self.low, self.high = per_scrape, low, high
        self.started = 1.79e9 + seed  # its process's start: a new one on restart
        self.prompts: list[int] = []
        self.outputs: list[int] = []
        self.batches: list[list[int]] = []  # the prompts each scrape finished, in order
        self.answers_left: int | None = None  # None: answers every scrape
        self.restart_after: int | None = None  # restart after this many scrapes
        self._rng = random.Random(seed)

    def scrape(self) -> str:
        if self.answers_left is not None:
            if self.answers_left <= 0:
                raise httpx.ConnectError("connection refused")
            self.answers_left -= 1
        if self.restart_after is not None and len(self.batches) == self.restart_after:
            self.started += 100.0  # a new process: counters from zero
            self.prompts, self.outputs = [], []
        batch = [self._rng.randint(self.low, self.high) for _ in range(self.per_scrape)]
        self.batches.append(batch)
        self.prompts += batch
        self.outputs += [self._rng.randint(50, 400) for _ in batch]
        page = vllm_page(prompts=self.prompts, outputs=self.outputs, running=3.0,
                         hits=0.3 * sum(self.prompts), queries=sum(self.prompts))  # fmt: skip
        return with_process(page, self.started)


class Fleet:
    """Replicas by host, served at the wire."""

    def __init__(self, engines: dict[str, Engine]) -> None:
        self.engines = engines

    @classmethod
    def of(cls, count: int, *, first_seed: int = 0, per_scrape: int = 20) -> Fleet:
        return cls({f"10.0.1.{first_seed + i + 1}": Engine(first_seed + i, per_scrape=per_scrape)
                    for i in range(count)})  # fmt: skip

    @property
    def urls(self) -> list[str]:
        return [f"http://{host}:8000" for host in self.engines]

    def transport(self) -> httpx.MockTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            engine = self.engines.get(request.url.host)
            if engine is None or request.url.path != "/metrics":
                return httpx.Response(404)
            return httpx.Response(200, text=engine.scrape())

        return httpx.MockTransport(handler)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


async def capture(fleet: Fleet, hosts: list[str] | None = None) -> WorkloadShape:
    """The fleet's shape over WINDOW_S, a round of scrapes every INTERVAL_S."""
    clock = Clock()
    urls = [f"http://{h}:8000" for h in hosts] if hosts is not None else fleet.urls
    async with httpx.AsyncClient(transport=fleet.transport()) as client:
        replicas = [Replica(url) for url in urls]
        scrapers = {r: MetricsScraper(r.metrics_url, client=client, clock=clock.now)
                    for r in replicas}  # fmt: skip

        async def scrape(replica: Replica) -> Exposition:
            return await scrapers[replica](only=CAPTURE_METRICS)

        return await capture_fleet(
            replicas, scrape, seconds=WINDOW_S, interval_s=INTERVAL_S,
            sleep=clock.sleep, clock=clock.now, now=lambda: CAPTURED_AT,
        )  # fmt: skip


def in_window(engine: Engine) -> list[int]:
    """The prompts it finished after the window's first scrape (that one's are before it)."""
    return [p for batch in engine.batches[1:] for p in batch]


async def test_a_fleet_capture_is_the_sum_of_its_replicas() -> None:
    engines = {"10.0.1.1": Engine(1, per_scrape=10), "10.0.1.2": Engine(2, per_scrape=20),
               "10.0.1.3": Engine(3, per_scrape=30, low=600, high=1800)}  # fmt: skip
    fleet = await capture(Fleet(engines))

    window = [p for engine in engines.values() for p in in_window(engine)]
    assert len(window) == (10 + 20 + 30) * (ROUNDS - 1)
    assert fleet.prompt_tokens == lengths(window)  # every replica's buckets, summed
    assert fleet.arrivals.request_rate == pytest.approx(len(window) / WINDOW_S, abs=1e-4)
    assert fleet.arrivals.concurrency == pytest.approx(9.0)  # 3 running on each
    assert fleet.prefix.hit_rate == pytest.approx(0.3)
    assert (fleet.arrivals.replicas, fleet.arrivals.per) == (3, "fleet")
    assert fleet.source.startswith("metrics fleet of 3 of 3 replicas over 60 s (13 rounds)")

    # Each replica read alone (the same scripted traffic): the fleet's rate is their sum.
    alone = [await capture(Fleet({h: Engine(n, per_scrape=e.per_scrape, low=e.low, high=e.high)}))
             for n, (h, e) in enumerate(engines.items(), 1)]  # fmt: skip
    assert all((s.arrivals.replicas, s.arrivals.per) == (1, "replica") for s in alone)
    assert fleet.arrivals.request_rate == pytest.approx(
        sum(s.arrivals.request_rate for s in alone), abs=1e-3
    )
    assert fleet.prompt_tokens.count == sum(s.prompt_tokens.count for s in alone)


async def test_two_replicas_then_four_with_the_same_traffic_each_is_not_drift() -> None:
    two = await capture(Fleet.of(2, first_seed=0))
    four = await capture(Fleet.of(4, first_seed=10))  # an autoscaler doubled the replicas
    assert four.arrivals.request_rate == pytest.approx(2 * two.arrivals.request_rate)

    result = diff(two, four)
    assert not result.drifted, result.lines()
    (rate,) = [d for d in result.dimensions if d.name == "arrivals.request_rate"]
    assert rate.old == pytest.approx(4.0) and rate.new == pytest.approx(4.0)  # req/s per replica
    assert rate.line.startswith(
        "request rate per replica (over a fleet of 2 replicas -> over a fleet of 4 replicas) "
    ), rate.line


async def test_twice_the_traffic_on_each_replica_is_drift() -> None:
    two = await capture(Fleet.of(2, first_seed=0))
    four = await capture(Fleet.of(4, first_seed=10, per_scrape=40))
    result = diff(two, four)
    assert [d.name for d in result.dimensions if d.drifted] == ["arrivals.request_rate"]
    (rate,) = [d for d in result.dimensions if d.name == "arrivals.request_rate"]
    assert rate.old == pytest.approx(4.0) and rate.new == pytest.approx(8.0)
    assert "per replica" in rate.line and rate.line.endswith("DRIFTED")


async def test_a_replica_that_stops_answering_is_named_and_its_answers_counted() -> None:
    fleet = Fleet.of(3)
    gone = fleet.engines["10.0.1.3"]
    gone.answers_left = 4  # answers the first 4 rounds, then refuses connections
    shape = await capture(fleet)

    assert "10.0.1.3:8000 answered 4 of 13 scrapes" in shape.source, shape.source
    assert "cannot scrape http://10.0.1.3:8000/metrics" in shape.source
    others = [p for host in ("10.0.1.1", "10.0.1.2") for p in in_window(fleet.engines[host])]
    assert shape.prompt_tokens.count == len(others) + len(in_window(gone))  # 3 batches of it
    assert len(in_window(gone)) == 3 * 20
    assert shape.arrivals.replicas == 3  # it answered twice: its delta is read


async def test_a_replica_that_restarted_is_named_and_read_within_each_process() -> None:
    fleet = Fleet.of(2)
    restarted = fleet.engines["10.0.1.2"]
    restarted.restart_after = 6  # scrape 7 comes from a new process, counters from zero
    shape = await capture(fleet)

    assert "10.0.1.2:8000 restarted inside the window" in shape.source, shape.source
    # Its old process's growth (scrapes 1-6) and its new one's from its first page (7-13):
    # never the new counters minus the old, which would be negative.
    counted = sum(map(len, restarted.batches[1:6])) + sum(map(len, restarted.batches[7:]))
    steady = len(in_window(fleet.engines["10.0.1.1"]))
    assert shape.prompt_tokens.count == steady + counted


def test_a_shape_stored_without_the_fields_is_one_replica_per_replica(tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    written = shapes.dumps(chat(), "yaml")
    path.write_text(written.replace("  replicas: 1\n", "").replace("  per: replica\n", ""))
    assert "replicas" in written and "replicas" not in path.read_text()  # as stored before
    old = shapes.load(path)
    assert (old.arrivals.replicas, old.arrivals.per) == (1, "replica")


async def test_workload_diff_says_the_rates_are_compared_per_replica(tmp_path: Path) -> None:
    from bot.app.cli import cli

    shapes.save(await capture(Fleet.of(2, first_seed=0)), tmp_path / "two.yaml")
    shapes.save(await capture(Fleet.of(4, first_seed=10)), tmp_path / "four.yaml")
    result = CliRunner().invoke(
        cli, ["workload", "diff", str(tmp_path / "two.yaml"), str(tmp_path / "four.yaml")]
    )
    assert result.exit_code == 0, result.output
    assert "request rate per replica (over a fleet of 2 replicas -> over a fleet of 4 " in (
        result.output
    )


# The drift job over a target of four replicas, whose ADR was measured on two.

REPLICAS = [f"http://10.0.1.{i}:8000" for i in range(1, 5)]


@pytest.fixture
async def drift(
    tmp_path: Path, slack: FakeSlack
) -> AsyncIterator[tuple[Harness, Fleet, ShapeCanary]]:
    measured_on_two = await capture(Fleet.of(2, first_seed=20))
    fleet = Fleet.of(4)
    canary = ShapeCanary()
    scheduler = {"workload_every_s": 300, "workload_window_s": WINDOW_S,
                 "targets": {"prod-a": {"adrs": [ADR]}}}  # fmt: skip
    h = harness(tmp_path, slack=slack, scheduler=scheduler, transport=fleet.transport(),
                bot_options={"gate": canary},
                targets={"prod-a": {"vllm_url": REPLICAS[0], "replicas": REPLICAS,
                                    "actuator": {"kind": "dry-run"}}})  # fmt: skip
    record_workload(Path(h.bot.flows.settings.paths.adr), measured_on_two)
    yield h, fleet, canary
    await h.close()


async def _tick(h: Harness) -> Mapping[str, Any]:
    assert h.bot.scheduler is not None
    job = next(j for j in h.bot.scheduler.jobs if j.name == "workload:prod-a")
    (result,) = await h.bot.scheduler.runner.tick(job)
    await h.bot.tasks.drain()
    assert result.state == "done", result.detail
    return result.detail


async def test_the_drift_job_reads_every_replica_and_compares_per_replica(
    drift: tuple[Harness, Fleet, ShapeCanary],
) -> None:
    h, fleet, canary = drift
    alike = await _tick(h)
    assert alike["drifted"] == [], alike["dimensions"]
    assert all(len(e.batches) == ROUNDS for e in fleet.engines.values())  # each one scraped
    assert str(alike["live_source"]).startswith("metrics fleet of 4 of 4 replicas")

    for engine in fleet.engines.values():
        engine.per_scrape = 40  # each replica serves twice the traffic
    h.wall.advance(300)
    drifted = await _tick(h)
    assert drifted["drifted"] == [ADR]
    (line,) = drifted["dimensions"][ADR]
    assert line.startswith("request rate per replica (over a fleet of 2 replicas -> over a "
                           "fleet of 4 replicas) 4 -> 8 req/s"), line  # fmt: skip
    (replayed,) = canary.shapes  # one engine replays one replica's share
    assert replayed is not None and replayed.arrivals.per == "replica"
    assert replayed.arrivals.request_rate == pytest.approx(8.0)


def test_cli_capture_reads_each_metrics_url_as_one_replica_of_a_fleet(tmp_path: Path) -> None:
    from bot.app.cli import cli
    from tests.fakes.metrics_server import RecordedMetrics

    def pages(started: float) -> list[str]:
        idle = with_process(vllm_page(prompts=[]), started)
        return [idle] + [with_process(vllm_page(prompts=[100] * 8), started)] * 50

    out = tmp_path / "fleet.yaml"
    with RecordedMetrics(pages(1.79e9)) as a, RecordedMetrics(pages(1.79e9 + 7)) as b:
        urls = [arg for e in (a, b) for arg in ("--metrics-url", f"{e.base_url}/metrics")]
        result = CliRunner().invoke(
            cli, ["workload", "capture", *urls, "--interval", "0.05", "--seconds", "0.2",
                  "-o", str(out), "--quiet"],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "(over a fleet of 2 replicas)" in result.output
    shape = shapes.load(out)
    assert shape.prompt_tokens.count == 16  # 8 from each
    assert (shape.arrivals.replicas, shape.arrivals.per) == (2, "fleet")


def test_prometheus_counts_the_replicas_its_series_are_of() -> None:
    from bot.diagnosis.probes.prometheus_capture import replicas_in

    count = "vllm:request_prompt_tokens_count"
    rows = [
        {"__name__": count, "instance": "10.0.0.5:8000", "engine": "0"},
        {"__name__": count, "instance": "10.0.0.5:8000", "engine": "1"},  # data parallel: one
        {"__name__": count, "instance": "10.0.0.9:8000", "engine": "0"},
        {"__name__": "vllm:num_requests_running", "instance": "10.0.0.7:8000"},  # no lengths
    ]
    assert replicas_in(rows) == 2
    assert replicas_in(rows[:2]) == 1


prometheus = recorded_prometheus  # the module-scoped Prometheus of test_workload_prometheus


async def test_a_prometheus_capture_over_two_engines_is_the_fleets(prometheus: str) -> None:
    fleet = await prometheus_capture(prometheus, '{job="vllm"}', minutes=10)  # A and B
    assert (fleet.arrivals.replicas, fleet.arrivals.per) == (2, "fleet")
    one = await prometheus_capture(prometheus, '{instance="10.0.0.5:8000"}', minutes=10)
    assert (one.arrivals.replicas, one.arrivals.per) == (1, "replica")
