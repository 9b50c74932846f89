"""The canary's reading of streamed events: tokens from usage, error events, broken lines.

And the stream's framing end to end, against a real local server that frames its events with
CRLF or CR (both allowed by the SSE spec): the canary counts their tokens, and a run whose
events carry none is "not measured" and fails its gate, also as the CLI's exit code.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest

from bot.canary.client import Outcome, RequestRecord, StreamError, _handle_event
from bot.canary.runner import CanaryRun
from bot.canary.workload import Workload
from tests.fakes.sse_engine import MODEL, SseEngine, token_event

GUARD_S = 60.0  # a hang guard for a broken client, never reached by a working one


def event(payload: str) -> str:
    return payload  # an event's data, as bot.kernel.runtime.sse dispatches it


def test_usage_on_every_chunk_counts_tokens_exactly_even_when_one_chunk_carries_several() -> None:
    record = RequestRecord(sent_at=0.0)
    chunk = '{"choices":[{"index":0,"text":"%s","finish_reason":null}],"usage":{"prompt_tokens":7,"completion_tokens":%d}}'
    assert not _handle_event(event(chunk % ("a", 1)), record, 1.0)
    assert not _handle_event(event(chunk % ("", 2)), record, 1.5)  # a partial UTF-8 byte
    assert not _handle_event(event(chunk % ("bcd", 5)), record, 2.0)
    assert (record.output_tokens, record.prompt_tokens) == (5, 7)
    assert (record.first_token_at, record.last_token_at, record.itl_s) == (1.0, 2.0, [0.5, 0.5])
    assert _handle_event("[DONE]", record, 3.0)


def test_chat_deltas_without_usage_count_one_token_per_chunk() -> None:
    """The role chunk and a chunk that only ends the answer are no tokens; an empty delta is
    (vLLM sends one for a token that ends inside a UTF-8 character)."""
    record = RequestRecord(sent_at=0.0)
    chunks = [{"delta": {"role": "assistant", "content": ""}}, {"delta": {"content": "He"}},
              {"delta": {"content": "llo"}}, {"delta": {"content": ""}},
              {"delta": {}, "finish_reason": "stop"}]  # fmt: skip
    for i, choice in enumerate(chunks):
        _handle_event(event(json.dumps({"choices": [choice]})), record, i)
    assert record.output_tokens == 3 and record.first_token_at == 1


def test_usage_once_counts_one_token_per_chunk_then_the_final_usage_is_exact() -> None:
    """The canary asks for usage once (as production clients do): while the stream runs each
    token chunk counts one (a partial UTF-8 byte too, and the last token, which comes with the
    finish reason), and the final usage chunk gives the engine's exact count (a lagging server
    packs several tokens into one chunk)."""
    record = RequestRecord(sent_at=0.0)
    chunk = '{"choices":[{"index":0,"text":"%s","finish_reason":%s}]}'
    _handle_event(event(chunk % ("a", "null")), record, 1.0)
    _handle_event(event(chunk % ("", "null")), record, 1.5)  # a partial UTF-8 byte
    _handle_event(event(chunk % ("bcd", "null")), record, 2.0)  # three tokens packed in one
    _handle_event(event(chunk % ("", '"length"')), record, 2.5)  # the last, a partial byte
    assert record.output_tokens == 4 and record.finish_reason == "length"
    assert (record.last_token_at, record.itl_s) == (2.5, [0.5, 0.5, 0.5])
    usage = '{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":6}}'
    assert not _handle_event(event(usage), record, 3.0)
    assert (record.output_tokens, record.prompt_tokens, record.last_token_at) == (6, 7, 2.5)


def test_a_one_token_answer_with_empty_text_has_a_first_token() -> None:
    """/v1/completions with max_tokens 1 streams one chunk: the token (its text empty when it
    ends inside a UTF-8 character) and the finish reason. The demo's prefill probe reads that
    chunk's time as TTFT; counting it as no token left the probe with none."""
    record = RequestRecord(sent_at=0.0)
    one = '{"choices":[{"index":0,"text":"","finish_reason":"length"}]}'
    _handle_event(event(one), record, 0.8)
    assert (record.output_tokens, record.ttft_s) == (1, 0.8)


def test_data_as_read_bytes_counts_as_its_text_does() -> None:
    """The canary hands the parser's bytes to the JSON decoder as read (a token's text is
    decoded once, or not at all): the counts are those of the decoded text, also for a text
    that holds what looks like other fields, and for bytes that are no UTF-8."""
    chunks = [
        '{"choices":[{"index":0,"text":"a","finish_reason":null}]}',
        '{"choices":[{"index":0,"text":"\\"finish_reason\\":\\"stop\\",\\"usage\\":{}","finish_reason":null}]}',
        '{"choices":[{"index":0,"text":"","finish_reason":"length"}]}',
        '{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":5}}',
    ]
    as_text, as_bytes = RequestRecord(sent_at=0.0), RequestRecord(sent_at=0.0)
    for i, chunk in enumerate(chunks):
        _handle_event(chunk, as_text, float(i))
        _handle_event(chunk.encode(), as_bytes, float(i))
    assert as_bytes == as_text
    counts = (as_bytes.output_tokens, as_bytes.prompt_tokens, as_bytes.finish_reason)
    assert counts == (5, 7, "length")
    assert (as_bytes.first_token_at, as_bytes.itl_s) == (0.0, [1.0, 1.0])
    broken = RequestRecord(sent_at=0.0)
    _handle_event(b'{"choices":[{"index":0,"text":"\xff\xfe","finish_reason":null}]}', broken, 1.0)
    assert (broken.output_tokens, broken.first_token_at) == (1, 1.0)
    assert _handle_event(b"[DONE]", broken, 2.0)


def test_chat_deltas_as_bytes_count_as_their_text_does() -> None:
    chunks = [{"delta": {"role": "assistant", "content": ""}}, {"delta": {"content": "He"}},
              {"delta": {"content": ""}}, {"delta": {"content": None}},
              {"delta": {}, "finish_reason": "stop"}]  # fmt: skip
    record = RequestRecord(sent_at=0.0)
    for i, choice in enumerate(chunks):
        _handle_event(json.dumps({"choices": [choice]}).encode(), record, i)
    assert (record.output_tokens, record.first_token_at, record.finish_reason) == (2, 1, "stop")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ('{"error":{"message":"deadline exceeded","code":504}}', "deadline exceeded"),
        ("{not json", "not a completion chunk"),
        ('"just a string"', "not a completion chunk"),
    ],
)
@pytest.mark.parametrize("as_bytes", [False, True], ids=["text", "bytes"])
def test_an_error_event_or_a_broken_line_fails_the_request(
    payload: str, message: str, as_bytes: bool
) -> None:
    data = payload.encode() if as_bytes else event(payload)
    with pytest.raises(StreamError, match=message):
        _handle_event(data, RequestRecord(sent_at=0.0), 1.0)


# -- framing, end to end ---------------------------------------------------------------------

NO_TOKEN = json.dumps({"id": "cmpl-fake", "object": "text_completion", "model": MODEL,
                       "choices": []})  # fmt: skip


class FramedEngine(SseEngine):
    """tests/fakes/sse_engine's server with each event framed by ``end`` instead of LF.

    ``split`` sends each event's last byte in a read of its own (a CRLF split between two
    reads); ``tokens=False`` streams events whose chunks carry no token; ``unterminated``
    ends the body right after the last token's data line (no blank line, no ``[DONE]``).
    """

    def __init__(
        self, end: bytes, *, split: bool = False, tokens: bool = True, unterminated: bool = False
    ) -> None:
        super().__init__()
        self.end, self.split, self.tokens, self.unterminated = end, split, tokens, unterminated

    async def _stream(
        self, body: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        self.streams += 1
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        n = int(body["max_tokens"])
        events = [
            token_event(i, 3, last=i == n - 1) if self.tokens else f"data: {NO_TOKEN}\n\n".encode()
            for i in range(n)
        ]
        if self.unterminated:
            events[-1] = events[-1].removesuffix(b"\n\n")
        for raw in events if self.unterminated else [*events, b"data: [DONE]\n\n"]:
            raw = raw.replace(b"\n", self.end)
            for piece in [raw[:-1], raw[-1:]] if self.split else [raw]:
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        self.completed += 1
        return True


def workload(engine: SseEngine) -> Workload:
    return Workload(
        endpoint=f"{engine.base_url}/v1/completions", concurrency=2, num_requests=4,
        prompt_length=8, output_length=5,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("end", "split"),
    [(b"\r\n", False), (b"\r\n", True), (b"\r", False)],
    ids=["CRLF", "CRLF split over reads", "CR"],
)
async def test_the_canary_counts_the_tokens_of_events_framed_with_crlf_or_cr(
    end: bytes, split: bool
) -> None:
    async with FramedEngine(end, split=split) as engine:
        run = CanaryRun(workload(engine), metrics_url=None)
        report = (await asyncio.wait_for(run.run(), GUARD_S)).report().json_dict()
    assert engine.completed == 4
    assert [(r.outcome, r.output_tokens) for r in run.records] == [(Outcome.OK, 5)] * 4
    assert report["tokens"]["delivered"] == 20 and report["tpot_ms"]["count"] == 4
    assert report["passed"] and [g["name"] for g in report["gates"]] == ["max_error_rate"]


async def test_the_last_event_of_a_body_that_ends_without_its_blank_line_still_counts() -> None:
    async with FramedEngine(b"\r\n", unterminated=True) as engine:
        run = CanaryRun(workload(engine), metrics_url=None)
        report = (await asyncio.wait_for(run.run(), GUARD_S)).report().json_dict()
    assert [(r.outcome, r.output_tokens) for r in run.records] == [(Outcome.OK, 5)] * 4
    assert report["passed"]


async def test_a_run_whose_events_carry_no_tokens_is_not_measured_and_fails() -> None:
    async with FramedEngine(b"\n", tokens=False) as engine:
        run = CanaryRun(workload(engine), metrics_url=None)
        report = (await asyncio.wait_for(run.run(), GUARD_S)).report().json_dict()
    assert report["requests"]["ok"] == 4 and report["tokens"]["streamed"] == 0
    assert not report["passed"]
    failed = [g for g in report["gates"] if not g["passed"]]
    assert [g["name"] for g in failed] == ["measured"]
    assert failed[0]["reason"] == (
        "not measured: 4 requests succeeded but streamed no tokens"
        " (check the server's event framing)"
    )


async def test_latency_checker_exits_1_for_a_run_that_measured_nothing() -> None:
    async with FramedEngine(b"\r\n", tokens=False) as engine:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "latency_checker", "--endpoint",
            f"{engine.base_url}/v1/completions", "--num-requests", "4", "--concurrency", "2",
            "--prompt-length", "8", "--output-length", "3", "--metrics-url", "none",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output, _ = await asyncio.wait_for(process.communicate(), GUARD_S)
    text = output.decode()
    assert process.returncode == 1, text
    assert "FAIL  measured: not measured: 4 requests succeeded but streamed no tokens" in text
    assert "gate failed: measured" in text
