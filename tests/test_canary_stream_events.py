"""The canary's reading of streamed events: tokens from usage, error events, broken lines."""

from __future__ import annotations

import json

import pytest

from bot.canary.client import RequestRecord, StreamError, _handle_event


def event(payload: str) -> bytes:
    return f"data: {payload}".encode()


def test_usage_on_every_chunk_counts_tokens_exactly_even_when_one_chunk_carries_several() -> None:
    record = RequestRecord(sent_at=0.0)
    chunk = '{"choices":[{"index":0,"text":"%s","finish_reason":null}],"usage":{"prompt_tokens":7,"completion_tokens":%d}}'
    assert not _handle_event(event(chunk % ("a", 1)), record, 1.0)
    assert not _handle_event(event(chunk % ("", 2)), record, 1.5)  # a partial UTF-8 byte
    assert not _handle_event(event(chunk % ("bcd", 5)), record, 2.0)
    assert (record.output_tokens, record.prompt_tokens) == (5, 7)
    assert (record.first_token_at, record.last_token_at, record.itl_s) == (1.0, 2.0, [0.5, 0.5])
    assert _handle_event(b"data: [DONE]", record, 3.0)


def test_chat_deltas_without_usage_count_one_token_per_chunk() -> None:
    record = RequestRecord(sent_at=0.0)
    for i, content in enumerate(["He", "llo", ""]):
        chunk = json.dumps({"choices": [{"delta": {"content": content}}]})
        _handle_event(event(chunk), record, i)
    assert record.output_tokens == 2


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ('{"error":{"message":"deadline exceeded","code":504}}', "deadline exceeded"),
        ("{not json", "not a completion chunk"),
        ('"just a string"', "not a completion chunk"),
    ],
)
def test_an_error_event_or_a_broken_line_fails_the_request(payload: str, message: str) -> None:
    with pytest.raises(StreamError, match=message):
        _handle_event(event(payload), RequestRecord(sent_at=0.0), 1.0)
