"""The canary's load shapes: steady concurrency that holds, and the seed's pulse."""

from __future__ import annotations

import pytest

from bot.canary.client import Outcome
from bot.canary.runner import CanaryRun, pattern
from bot.canary.workload import Workload
from bot.kernel.errors import EndpointError
from tests.fakes.sse_engine import SseEngine

PULSE = Workload(
    endpoint="http://x/v1/completions", concurrency=8, num_requests=None, duration_s=3.0,
    pulse_period_s=1.0, pulse_width_s=0.3, pulse_base_share=0.25, output_length=4,
)  # fmt: skip


@pytest.mark.parametrize(
    ("elapsed", "burst", "wait"),
    [(0.0, True, 0.0), (0.2, True, 0.0), (0.4, False, 0.6), (0.99, False, 0.01), (1.1, True, 0.0)],
)
def test_pulse_shape_bursts_at_the_start_of_every_period(
    elapsed: float, burst: bool, wait: float
) -> None:
    assert PULSE.in_burst(elapsed) is burst
    assert PULSE.next_burst_in(elapsed) == pytest.approx(wait)


def test_pulse_shape_is_in_the_report() -> None:
    assert PULSE.base_streams() == 2
    assert pattern(PULSE) == {
        "kind": "pulse", "base_streams": 2, "peak_streams": 8, "period_s": 1.0, "burst_s": 0.3,
    }  # fmt: skip
    assert pattern(Workload(endpoint="http://x/v1/completions", concurrency=3)) == {
        "kind": "steady", "streams": 3,
    }  # fmt: skip


def in_flight_at(records, t: float) -> int:
    return sum(1 for r in records if r.sent_at <= t < (r.finished_at or float("inf")))


async def test_pulse_sends_from_burst_streams_only_during_bursts() -> None:
    # Each stream takes about 0.1 s (4 tokens, 25 ms apart): bursts overlap, pauses drain.
    async with SseEngine(token_delay_s=0.025) as engine:
        workload = Workload(**{**PULSE.__dict__, "endpoint": f"{engine.base_url}/v1/completions"})
        run = CanaryRun(workload)
        report = (await run.run()).report().json_dict()
    records = run.records
    assert all(r.outcome is Outcome.OK for r in records) and report["passed"]
    assert report["workload"]["pattern"]["kind"] == "pulse"
    t0 = min(r.sent_at for r in records)
    # Requests sent well outside every burst can only come from the 2 base streams.
    # The burst is checked right before a request is sent, with no await between; only the OS
    # preempting the client between the two (on a loaded box, tens of ms) stamps a send later.
    slack_s = 0.1
    off_burst = [
        r
        for r in records
        if not workload.in_burst(r.sent_at - t0) and not workload.in_burst(r.sent_at - t0 - slack_s)
    ]
    assert off_burst, "the base load runs between bursts"
    assert max(in_flight_at(off_burst, r.sent_at) for r in off_burst) <= 2
    # In a burst the 6 burst streams send too (a base stream may be between requests then).
    assert max(in_flight_at(records, r.sent_at) for r in records) >= 6


async def test_steady_load_keeps_every_stream_busy_until_the_count_is_spent() -> None:
    async with SseEngine(token_delay_s=0.01) as engine:
        workload = Workload(
            endpoint=f"{engine.base_url}/v1/completions", concurrency=6, num_requests=30,
            output_length=4,
        )  # fmt: skip
        run = CanaryRun(workload)
        await run.run()
    assert len(run.records) == 30
    assert max(in_flight_at(run.records, r.sent_at) for r in run.records) == 6


async def test_no_vllm_metrics_beside_the_endpoint_is_a_warning_and_client_side_numbers() -> None:
    async with SseEngine() as engine:  # serves completions; /metrics is a 404 there
        workload = Workload(endpoint=f"{engine.base_url}/v1/completions", num_requests=4)
        run = CanaryRun(workload, discover_metrics=True)
        report = (await run.run()).report().json_dict()
        base = engine.base_url
    assert report["engine"] is None and report["workload"]["metrics_url"] is None
    assert report["goodput_source"].startswith("client")
    (warning,) = report["warnings"]
    assert "no vLLM /metrics page beside the endpoint" in warning
    assert f"{base}/metrics" in warning and f"{base}/engine/metrics" in warning


async def test_an_explicit_metrics_url_that_is_not_vllms_is_an_endpoint_error() -> None:
    async with SseEngine() as engine:
        workload = Workload(endpoint=f"{engine.base_url}/v1/completions", num_requests=4)
        run = CanaryRun(workload, metrics_url=f"{engine.base_url}/metrics")
        with pytest.raises(EndpointError, match="HTTP 404, not a metrics page"):
            await run.run()


def test_two_runs_of_one_fixed_workload_send_their_own_prompts_of_the_same_lengths() -> None:
    """A run that re-sent an earlier run's prompts would be served from the prefix cache: the
    before-run and the run after a change would not measure alike."""
    workload = Workload(endpoint="http://x/v1/completions", prompt_length=64, prefix_length=16)

    def prompts(run: CanaryRun) -> list[list[int]]:
        return [run._prompts.token_ids() for _ in range(3)]

    first, second = prompts(CanaryRun(workload)), prompts(CanaryRun(workload))
    assert [len(p) for p in first] == [len(p) for p in second] == [64, 64, 64]
    assert {tuple(p[:16]) for p in first} == {tuple(first[0][:16])}  # one prefix within a run
    assert first[0][:16] != second[0][:16] and first != second  # each run's own tokens
