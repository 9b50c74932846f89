"""The canary behind a Service: a fleet of replicas whose /metrics are each one pod's.

The endpoint (tests/fakes/sse_engine.py) streams every request; two pods' pages
(tests/fakes/replica_metrics.py) each count a share of the tokens it streamed, as the pods
behind a Service each generate part of the traffic. One pod's page must not read as the
fleet's: goodput is unknown and its gate cannot pass; the replicas merged read it whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import pytest
from click.testing import CliRunner

from bot.app.cli.canary import canary
from bot.canary.runner import CanaryRun
from bot.canary.verdict import Gates
from bot.canary.workload import Workload
from tests.fakes.replica_metrics import ReplicaMetrics
from tests.fakes.sse_engine import SseEngine

REQUESTS, OUTPUT = 20, 4
GATES = Gates.of(min_goodput_ratio=0.9)


@dataclass
class Fleet:
    endpoint: str
    pods: list[ReplicaMetrics]


@contextlib.asynccontextmanager
async def fleet(shares: Sequence[float], *, generated: float = 1.0) -> AsyncIterator[Fleet]:
    """A Service endpoint and one pod per share: each ends that share of its requests and
    counts that share of the tokens it streamed, times ``generated`` (2: half were wasted)."""
    async with SseEngine() as engine, contextlib.AsyncExitStack() as stack:

        def counted(share: float, per_request: float) -> Callable[[], float]:
            return lambda: share * per_request * engine.completed

        pods = [
            await stack.enter_async_context(
                ReplicaMetrics(
                    tokens=counted(share, generated * OUTPUT), requests=counted(share, 1.0)
                )
            )
            for share in shares
        ]
        yield Fleet(f"{engine.base_url}/v1/completions", pods)


def workload(endpoint: str) -> Workload:
    return Workload(endpoint=endpoint, concurrency=4, num_requests=REQUESTS, output_length=OUTPUT)


async def test_one_pods_page_under_a_fleets_traffic_is_not_full_goodput_and_fails_the_gate() -> (
    None
):
    async with fleet([0.5, 0.5]) as f:
        run = CanaryRun(
            workload(f.endpoint), gates=GATES, metrics_url=f"{f.pods[0].base_url}/metrics"
        )
        report = (await run.run()).report().json_dict()
    assert report["tokens"]["delivered"] == REQUESTS * OUTPUT
    assert report["tokens"]["engine_generated"] == REQUESTS * OUTPUT / 2
    assert report["goodput_ratio"] is None  # was min(2.0, 1.0): 100 %
    assert report["goodput_source"].startswith("partial")
    assert "--replica" in report["goodput_source"]
    assert report["engine_scope"].startswith("one /metrics page")
    assert report["kv_fragmentation"]["observed"] is None
    (gate,) = [g for g in report["gates"] if g["name"] == "min_goodput_ratio"]
    assert not gate["passed"] and "cannot judge" in gate["reason"]
    assert not report["passed"]


async def test_every_replica_merged_reads_the_whole_fleet_and_passes() -> None:
    async with fleet([0.5, 0.5]) as f:
        run = CanaryRun(workload(f.endpoint), gates=GATES, replicas=[p.base_url for p in f.pods])
        report = (await run.run()).report().json_dict()
        assert all(p.scrapes >= 2 for p in f.pods)
    assert report["tokens"]["engine_generated"] == REQUESTS * OUTPUT
    assert report["goodput_ratio"] == pytest.approx(1.0)
    assert report["goodput_source"] == "engine"
    assert report["engine_scope"] == "fleet: 2 replicas merged"
    assert len(report["engine_replicas"]) == 2
    assert report["passed"], report["gates"]


async def test_a_fleet_that_wasted_tokens_fails_the_gate_on_the_merged_read() -> None:
    # The pods generated twice what reached clients (work for requests that were abandoned).
    async with fleet([0.5, 0.5], generated=2.0) as f:
        run = CanaryRun(workload(f.endpoint), gates=GATES, replicas=[p.base_url for p in f.pods])
        report = (await run.run()).report().json_dict()
    assert report["goodput_ratio"] == pytest.approx(0.5)
    (gate,) = [g for g in report["gates"] if g["name"] == "min_goodput_ratio"]
    assert not gate["passed"] and "50" in gate["reason"]


async def test_a_counting_difference_within_the_tolerance_is_shown_as_measured_not_clamped() -> (
    None
):
    async with fleet([0.99]) as f:
        run = CanaryRun(
            workload(f.endpoint), gates=GATES, metrics_url=f"{f.pods[0].base_url}/metrics"
        )
        report = (await run.run()).report().json_dict()
    assert report["goodput_source"] == "engine"
    assert report["goodput_ratio"] == pytest.approx(1 / 0.99)  # above 1: never clamped
    assert report["passed"]


def test_replica_and_metrics_url_together_are_a_usage_error() -> None:
    result = CliRunner().invoke(
        canary,
        ["--endpoint", "http://x/v1/completions", "--replica", "http://a:8000",
         "--metrics-url", "http://a:8000/metrics"],
    )  # fmt: skip
    assert result.exit_code == 2 and "--replica and --metrics-url" in result.output


def test_help_says_concurrency_is_for_the_whole_fleet() -> None:
    text = " ".join(CliRunner().invoke(canary, ["--help"]).output.split())
    assert "for the whole fleet when it is a Service (not per replica)" in text
    assert "--replica URL" in text
