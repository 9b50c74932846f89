"""Gateway building blocks: timeout parsing, request costing, the token budget, limit changes,
and the app's side of the ASGI contract where a server is not needed to show it."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest

from bot.diagnosis.probes.exposition import Exposition
from bot.gateway.app import Gateway
from bot.gateway.budget import TokenBudget
from bot.gateway.costing import Costing, parse_body
from bot.gateway.deadlines import BadTimeout, parse_timeout, request_timeout
from bot.gateway.limits import Limits, LimitsError, read_limits_file, updated
from bot.gateway.responses import HTTPProblem
from tests.gateway_scripted import STREAM, ScriptedEngine, outcome


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("5", 5.0), ("2.5", 2.5), ("500ms", 0.5), ("2s", 2.0), (" 10MS ", 0.01), ("0.25S", 0.25),
     ("1e3ms", 1.0)],
)  # fmt: skip
def test_parse_timeout_reads_seconds_and_milliseconds(value: str, seconds: float) -> None:
    assert math.isclose(parse_timeout(value), seconds)


@pytest.mark.parametrize("value", ["abc", "", "ms", "-1", "0", "0ms", "nan", "inf", "5m", "1h"])
def test_parse_timeout_refuses_what_is_not_a_positive_duration(value: str) -> None:
    with pytest.raises(BadTimeout, match="X-Request-Timeout"):
        parse_timeout(value)


@pytest.mark.parametrize(
    ("header", "expected"), [(None, 30.0), ("10", 10.0), ("500ms", 0.5), ("9999", 60.0)]
)
def test_request_timeout_defaults_and_caps(header: str | None, expected: float) -> None:
    assert request_timeout(header, default_s=30.0, max_s=60.0) == expected


def test_request_timeout_caps_the_default_too() -> None:
    assert request_timeout(None, default_s=120.0, max_s=60.0) == 60.0


def user(content: object) -> dict[str, object]:
    """A chat message."""
    return {"role": "user", "content": content}


@pytest.mark.parametrize(
    ("body", "chat", "prompt", "output"),
    [
        ({"model": "m", "prompt": [1, 2, 3], "max_tokens": 10}, False, 3, 10),
        ({"model": "m", "prompt": [[1, 2], [3, 4, 5]], "max_tokens": 10}, False, 5, 10),
        ({"model": "m", "prompt": "abcdefgh", "max_tokens": 4}, False, 2, 4),
        ({"model": "m", "prompt": ["abcd", "abcde"], "max_tokens": 4}, False, 3, 4),
        ({"model": "m", "prompt": [1], "max_tokens": 5, "n": 3}, False, 1, 15),
        ({"model": "m", "prompt": [1]}, False, 1, 100),
        ({"model": "m", "messages": [user("abcd")], "max_completion_tokens": 7}, True, 5, 7),
        ({"model": "m", "messages": [user([{"type": "text", "text": "abcdefgh"}])]}, True, 6, 100),
        ({"model": "m", "messages": [user(None)], "max_tokens": 1}, True, 4, 1),
    ],
)  # fmt: skip
def test_costing_estimates_prompt_and_output_tokens(
    body: dict[str, object], chat: bool, prompt: int, output: int
) -> None:
    cost = Costing().estimate(body, chat=chat, default_max_tokens=100)
    assert (cost.prompt_tokens, cost.max_output_tokens, cost.total) == (
        prompt,
        output,
        prompt + output,
    )


def test_costing_uses_the_injected_tokenizer_for_text() -> None:
    costing = Costing(count_tokens=len)  # one token per character
    cost = costing.estimate(
        {"model": "m", "prompt": "abcdefgh", "max_tokens": 1}, chat=False, default_max_tokens=1
    )
    assert cost.prompt_tokens == 8


@pytest.mark.parametrize(
    ("body", "chat", "param"),
    [
        ({"prompt": [1]}, False, "model"),
        ({"model": "", "prompt": [1]}, False, "model"),
        ({"model": 3, "prompt": [1]}, False, "model"),
        ({"model": "m"}, False, "prompt"),
        ({"model": "m", "prompt": []}, False, "prompt"),
        ({"model": "m", "prompt": [1, "a"]}, False, "prompt"),
        ({"model": "m", "prompt": [-1]}, False, "prompt"),
        ({"model": "m", "prompt": [1], "max_tokens": 0}, False, "max_tokens"),
        ({"model": "m", "prompt": [1], "max_tokens": "5"}, False, "max_tokens"),
        ({"model": "m", "prompt": [1], "max_tokens": True}, False, "max_tokens"),
        ({"model": "m", "prompt": [1], "n": 0}, False, "n"),
        ({"model": "m", "prompt": [1], "stream": "yes"}, False, "stream"),
        ({"model": "m"}, True, "messages"),
        ({"model": "m", "messages": []}, True, "messages"),
        ({"model": "m", "messages": ["hi"]}, True, "messages"),
        ({"model": "m", "messages": [{"content": 5}]}, True, "messages"),
    ],
)
def test_costing_refuses_bodies_it_cannot_cost(
    body: dict[str, object], chat: bool, param: str
) -> None:
    with pytest.raises(HTTPProblem) as caught:
        Costing().estimate(body, chat=chat, default_max_tokens=16)
    assert (caught.value.status, caught.value.param) == (400, param)


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b"\xff\xfe", b"", b"null"])
def test_parse_body_refuses_what_is_not_a_json_object(raw: bytes) -> None:
    with pytest.raises(HTTPProblem) as caught:
        parse_body(raw)
    assert caught.value.status == 400


def test_budget_admits_until_the_limit_and_releases() -> None:
    budget = TokenBudget(100)
    assert budget.try_admit(60)
    assert not budget.try_admit(41)
    assert budget.try_admit(40)
    assert (budget.in_flight_tokens, budget.in_flight_requests) == (100, 2)
    budget.release(60)
    budget.release(40)
    assert (budget.in_flight_tokens, budget.in_flight_requests) == (0, 0)


def test_budget_zero_limit_means_unlimited_and_everything_fits() -> None:
    budget = TokenBudget(0)
    assert budget.fits_at_all(10**9) and budget.try_admit(10**9)


def test_budget_knows_a_cost_above_the_whole_limit_never_fits() -> None:
    budget = TokenBudget(100)
    assert budget.fits_at_all(100) and not budget.fits_at_all(101)


def test_budget_lowered_below_in_flight_admits_nothing_until_drained() -> None:
    budget = TokenBudget(100)
    assert budget.try_admit(80)
    budget.limit = 50
    assert not budget.try_admit(1)
    budget.release(80)
    assert budget.try_admit(50)


def test_limits_update_accepts_durations_in_timeout_syntax() -> None:
    new = updated(
        Limits(), {"default_timeout_s": "500ms", "max_timeout_s": 30, "max_inflight_tokens": 64}
    )
    assert (new.default_timeout_s, new.max_timeout_s, new.max_inflight_tokens) == (0.5, 30, 64)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_inflight_tokens": -1}, "max_inflight_tokens"),
        ({"unknown": 1}, "unknown"),
        ({"default_timeout_s": "soon"}, "default_timeout_s"),
        ({"default_timeout_s": 0}, "default_timeout_s"),
        ({"default_timeout_s": 100, "max_timeout_s": 10}, "above max_timeout_s"),
        ({"retry_after_s": 0}, "retry_after_s"),
    ],
)
def test_limits_update_refuses_bad_changes(change: dict[str, object], message: str) -> None:
    with pytest.raises(LimitsError, match=message):
        updated(Limits(), change)


def test_read_limits_file_reads_yaml_and_refuses_lists(tmp_path) -> None:
    good = tmp_path / "limits.yaml"
    good.write_text("max_inflight_tokens: 2048\ndefault_timeout_s: 30s\n")
    assert updated(Limits(), read_limits_file(good)).max_inflight_tokens == 2048
    bad = tmp_path / "bad.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(LimitsError, match="mapping"):
        read_limits_file(bad)


def test_limits_update_applies_an_adrs_gateway_block_as_written() -> None:
    rules = {"require_request_timeout": True, "timeout_header": "X-Request-Timeout",
             "drop_on_cancel": True, "upstream_timeout_s": 30.0, "max_in_flight_tokens": None}  # fmt: skip
    new = updated(Limits(), rules)
    assert (new.require_timeout_header, new.default_timeout_s, new.max_inflight_tokens) == (
        True,
        30.0,
        0,
    )
    assert updated(Limits(), {"max_in_flight_tokens": 4096}).max_inflight_tokens == 4096


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ({"timeout_header": "X-Deadline"}, "X-Request-Timeout only"),
        ({"drop_on_cancel": False}, "drop_on_cancel"),
    ],
)
def test_limits_update_refuses_adr_rules_it_cannot_honour(
    rules: dict[str, object], message: str
) -> None:
    with pytest.raises(LimitsError, match=message):
        updated(Limits(), rules)


async def test_a_send_that_fails_because_the_client_left_is_a_client_cancel() -> None:
    # ASGI 2.4 servers raise OSError from send once the client has gone (older ones return
    # quietly and say http.disconnect on receive): here the failed send is the only sign.
    engine = ScriptedEngine(gated=True)
    upstream = httpx.AsyncClient(transport=httpx.MockTransport(engine), base_url="http://engine")
    app = Gateway(client=upstream)
    request = json.dumps({**STREAM, "max_tokens": 100}).encode()
    bodies: list[bytes] = []

    async def receive() -> dict[str, object]:
        if not bodies:
            return {"type": "http.request", "body": request, "more_body": False}
        await asyncio.Event().wait()  # the server has not seen the client go (yet)
        raise AssertionError("unreachable")

    async def send(message: dict[str, object]) -> None:
        if message["type"] == "http.response.body":
            if bodies:
                raise OSError("the client went away")  # uvicorn's ClientDisconnected is one
            bodies.append(message["body"])  # type: ignore[arg-type]

    for _ in range(2):
        engine.step.put_nowait(None)
    scope = {
        "type": "http", "method": "POST", "path": "/v1/completions",
        "raw_path": b"/v1/completions", "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "asgi": {"version": "3.0", "spec_version": "2.4"},
    }  # fmt: skip
    async with upstream:
        await app(scope, receive, send)  # type: ignore[arg-type]
    page = Exposition.parse(app.metrics.exposition().decode(), at=0.0)
    assert len(bodies) == 1 and engine.closed == 1  # the engine's stream was closed at once
    assert outcome(page, "client_cancel") == 1
    assert page.total("ruleloop_gateway_output_tokens_total", where={"kind": "wasted"}) == 2
    assert app.budget.in_flight_tokens == 0 and app.budget.in_flight_requests == 0


@pytest.mark.parametrize(
    ("limits", "output"),
    [
        ({"max_tokens": 1, "max_completion_tokens": 100_000}, 100_000),
        ({"max_completion_tokens": 1, "max_tokens": 100_000}, 100_000),
        ({"max_tokens": 5, "n": 2, "best_of": 3}, 15),
    ],
)
def test_costing_counts_the_largest_output_limit_the_engine_may_obey(
    limits: dict[str, int], output: int
) -> None:
    body = {"model": "m", "messages": [user("hi")], **limits}
    cost = Costing().estimate(body, chat=True, default_max_tokens=16)
    assert cost.max_output_tokens == output


PROMPT = "x" * 54_000  # ~13,500 tokens at 4 bytes per token


def _call(arguments: str) -> dict[str, object]:
    function = {"name": "f", "arguments": arguments}
    return {
        "role": "assistant",
        "tool_calls": [{"id": "c", "type": "function", "function": function}],
    }


@pytest.mark.parametrize(
    "carrier",
    [
        {"tools": [{"type": "function", "function": {"name": "f", "description": PROMPT}}]},
        {"messages": [user("hi"), _call(PROMPT)]},
        {"documents": [{"title": "t", "text": PROMPT}]},
        {"chat_template_kwargs": {"context": PROMPT}},
        {"messages": [user([{"type": "input_text", "text": PROMPT}])]},
    ],
    ids=["tools", "tool_calls", "documents", "chat_template_kwargs", "other_part"],
)
def test_costing_counts_a_prompt_carried_outside_message_content(
    carrier: dict[str, object],
) -> None:
    in_content = Costing().estimate(
        {"model": "m", "messages": [user(PROMPT)], "max_tokens": 1},
        chat=True,
        default_max_tokens=1,
    )
    body = {"model": "m", "messages": [user("hi")], "max_tokens": 1, **carrier}
    cost = Costing().estimate(body, chat=True, default_max_tokens=1)
    assert cost.prompt_tokens >= in_content.prompt_tokens


@pytest.mark.parametrize(
    ("field", "value", "chat"),
    [
        ("chat_template", "{% for i in range(99999) %}x{% endfor %}", True),
        ("prompt_embeds", "AAAA", False),
    ],
)
def test_costing_refuses_fields_whose_tokens_the_body_does_not_tell(
    field: str, value: str, chat: bool
) -> None:
    body = {"model": "m", "messages": [user("hi")], "prompt": [1], field: value}
    with pytest.raises(HTTPProblem) as caught:
        Costing().estimate(body, chat=chat, default_max_tokens=16)
    assert (caught.value.status, caught.value.param) == (400, field)
