"""The streaming client's impatient users, against a real local SSE server (tests/fakes/sse_engine).

The server can hold a stream open after N tokens until the client hangs up, so a client that
gives up is the only way such a stream ends: cancellation is built by construction, not timed.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from bot.canary.client import Outcome, RequestRecord, stream_request
from bot.canary.runner import CanaryRun
from bot.canary.workload import CancelMode, Workload, check
from tests.fakes.sse_engine import MODEL, SseEngine

VLLM_PAGES = Path(__file__).parent / "fixtures" / "vllm-0.32.0"
GUARD_S = 60.0  # a hang guard for a broken client, never reached by a working one


def body(max_tokens: int) -> dict[str, object]:
    return {"model": MODEL, "prompt": [101, 102, 103], "max_tokens": max_tokens, "stream": True}


async def stream(engine: SseEngine, max_tokens: int, **kwargs: object) -> RequestRecord:
    record = RequestRecord(sent_at=time.perf_counter())
    async with aiohttp.ClientSession() as session:
        await stream_request(
            session,
            f"{engine.base_url}/v1/completions",
            body(max_tokens),
            record,
            timeout_s=GUARD_S,
            **kwargs,  # type: ignore[arg-type]
        )
    return record


async def test_client_gives_up_after_n_tokens_and_hangs_up() -> None:
    # The server sends 5 tokens and then waits: only a client that hangs up ends the stream.
    async with SseEngine(hold_after=5) as engine:
        record = await stream(engine, 32, cancel_after_tokens=3)
        await asyncio.wait_for(engine.disconnected.wait(), GUARD_S)
    assert record.outcome is Outcome.CANCELLED and record.error is None
    # Tokens 4 and 5 may have arrived in the same read: the client stopped counting at 3.
    assert record.output_tokens == 3
    assert record.first_token_at is not None and record.finished_at is not None
    assert engine.disconnects == [5] and engine.completed == 0


async def test_a_finished_stream_gives_its_connection_back_when_the_body_ends_later() -> None:
    """vLLM ends its HTTP body in a write after `[DONE]`. A client that stopped reading at
    `[DONE]` dropped the connection, so the next request paid for a new one, straight to vLLM
    only (a gateway ends both in one write): the two paths were not measured alike."""
    async with SseEngine(hold_body_end=True) as engine, aiohttp.ClientSession() as session:
        url = f"{engine.base_url}/v1/completions"
        first = RequestRecord(sent_at=time.perf_counter())
        task = asyncio.create_task(stream_request(session, url, body(4), first, timeout_s=GUARD_S))
        async with asyncio.timeout(GUARD_S):
            while first.finish_reason is None:  # the last token is in: [DONE] follows at once
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # the client has read [DONE]; now the body ends
        engine.body_end.set()
        await task
        second = RequestRecord(sent_at=time.perf_counter())
        await stream_request(session, url, body(4), second, timeout_s=GUARD_S)
    assert (first.outcome, second.outcome) == (Outcome.OK, Outcome.OK)
    assert first.output_tokens == second.output_tokens == 4
    assert engine.connections == 1  # the second request reused the first one's connection


async def test_cancel_after_first_token() -> None:
    async with SseEngine(hold_after=2) as engine:
        record = await stream(engine, 16, cancel_after_tokens=1)
        await asyncio.wait_for(engine.disconnected.wait(), GUARD_S)
    assert (record.outcome, record.output_tokens) == (Outcome.CANCELLED, 1)
    assert record.ttft_s is not None


async def test_an_answer_shorter_than_the_patience_completes() -> None:
    async with SseEngine() as engine:
        record = await stream(engine, 4, cancel_after_tokens=8)
    assert (record.outcome, record.output_tokens) == (Outcome.OK, 4)
    assert engine.completed == 1 and engine.disconnects == []


async def test_reaching_the_patience_on_the_last_token_is_not_giving_up() -> None:
    # The 4th token's chunk says the answer is complete: the client read a whole answer.
    async with SseEngine() as engine:
        record = await stream(engine, 4, cancel_after_tokens=4)
    assert (record.outcome, record.output_tokens, record.finish_reason) == (Outcome.OK, 4, "length")


async def test_abandon_after_time_hangs_up_a_stream_that_never_ends() -> None:
    # The stream holds after one token forever, so the deadline is what ends it, however fast.
    async with SseEngine(hold_after=1) as engine:
        record = await stream(engine, 16, abandon_after_s=0.05)
        await asyncio.wait_for(engine.disconnected.wait(), GUARD_S)
    assert (record.outcome, record.output_tokens) == (Outcome.CANCELLED, 1)
    assert engine.disconnects == [1]


async def test_on_first_token_is_called_once_when_the_first_token_arrives() -> None:
    seen: list[int] = []
    record = RequestRecord(sent_at=time.perf_counter())

    def first() -> None:
        seen.append(record.output_tokens)

    async with SseEngine() as engine, aiohttp.ClientSession() as session:
        await stream_request(
            session, f"{engine.base_url}/v1/completions", body(6), record,
            timeout_s=GUARD_S, on_first_token=first,
        )  # fmt: skip
    assert seen == [1] and record.output_tokens == 6


async def test_the_first_token_is_stamped_while_the_stream_is_still_open() -> None:
    # The server holds the stream after its first token until /metrics is scraped, so the
    # client must have stamped that token while the rest had not come (not at the stream's end).
    page = (VLLM_PAGES / "before.prom").read_text()
    record = RequestRecord(sent_at=time.perf_counter())
    async with (
        SseEngine(metrics_pages=[page], hold_until_scraped=True) as engine,
        aiohttp.ClientSession() as session,
    ):
        task = asyncio.create_task(stream_request(
            session, f"{engine.base_url}/v1/completions", body(6), record, timeout_s=GUARD_S,
        ))  # fmt: skip
        async with asyncio.timeout(GUARD_S):
            while record.first_token_at is None and not task.done():
                await asyncio.sleep(0.01)
        assert record.outcome is None and engine.scrapes == 0  # stamped mid-stream
        assert record.output_tokens == 1
        async with session.get(f"{engine.base_url}/metrics") as released:
            assert released.status == 200
        await task
    assert (record.outcome, record.output_tokens) == (Outcome.OK, 6)
    assert record.first_token_at < record.last_token_at  # type: ignore[operator]


async def test_canary_impatient_share_cancels_after_n_tokens() -> None:
    async with SseEngine() as engine:
        workload = Workload(
            endpoint=f"{engine.base_url}/v1/completions", concurrency=4, num_requests=16,
            prompt_length=8, output_length=12, cancel_share=0.5, cancel_after_tokens=2,
        )  # fmt: skip
        assert check(workload) == []
        run = CanaryRun(workload, metrics_url=None)
        report = (await run.run()).report().json_dict()
    cancelled = [r for r in run.records if r.outcome is Outcome.CANCELLED]
    ok = [r for r in run.records if r.outcome is Outcome.OK]
    assert cancelled and ok and len(cancelled) + len(ok) == 16
    assert {r.output_tokens for r in cancelled} == {2}
    assert {r.output_tokens for r in ok} == {12}
    assert report["requests"]["cancelled"] == len(cancelled)
    assert report["goodput_ratio"] == pytest.approx(
        12 * len(ok) / (12 * len(ok) + 2 * len(cancelled))
    )
    assert report["workload"]["cancel_after_tokens"] == 2


async def test_a_run_shorter_than_one_sample_interval_is_sampled_at_the_first_token() -> None:
    # Recorded vLLM pages: before the run, during it (KV in use), after it. Each stream waits
    # after its first token until the page is scraped, and an hour lies between samples: the
    # only sample there can be is the one taken when the first token arrives.
    pages = [(VLLM_PAGES / f"{name}.prom").read_text() for name in ("before", "during", "after")]
    async with SseEngine(metrics_pages=pages, hold_until_scraped=True) as engine:
        workload = Workload(
            endpoint=f"{engine.base_url}/v1/completions", concurrency=2, num_requests=2,
            prompt_length=8, output_length=4,
        )  # fmt: skip
        run = CanaryRun(workload, metrics_url=f"{engine.base_url}/metrics", sample_interval_s=3600)
        report = (await run.run()).report().json_dict()
    frag = report["kv_fragmentation"]
    assert (frag["samples"], frag["samples_with_kv"]) == (1, 1)
    assert 0.0 <= frag["observed"] <= 1.0
    # The sample counted what the client held when it asked: prompts, no KV for the newest token.
    assert report["timeline"][0]["resident_tokens"] in (8, 16)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"cancel_after_tokens": 0}, "--cancel-after-tokens must be at least 1 (got 0)"),
        ({"cancel_after_tokens": 64}, "--cancel-after-tokens must be below --output-length"),
        ({"cancel_after_tokens": 4, "cancel_share": 0.0}, "needs --cancel-share above 0"),
        ({"cancel_after_tokens": 4, "cancel_mode": CancelMode.HEADER}, "--cancel-mode abandon"),
    ],
)
def test_check_names_a_token_cancel_that_cannot_work(changes, problem) -> None:
    base = {"endpoint": "http://127.0.0.1:1/v1/completions", "output_length": 64,
            "cancel_share": 0.5}  # fmt: skip
    problems = check(Workload(**(base | changes)))
    assert len(problems) == 1 and problem in problems[0]


def test_check_accepts_a_token_cancel() -> None:
    workload = Workload(
        endpoint="http://127.0.0.1:1/v1/completions", output_length=64, cancel_share=0.5,
        cancel_after_tokens=1,
    )  # fmt: skip
    assert check(workload) == []
