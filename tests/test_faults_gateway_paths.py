"""The gateway routes on the path the engine would see: no spelling of a path slips past the limits.

Requests go over a raw socket (an HTTP client would tidy the paths before sending them) to the
real gateway (uvicorn) in front of the scripted engine (tests/gateway_scripted.py). The budget is
16 tokens and every inference body here costs more, so an inference request the gateway
recognised is a 413 and one it did not recognise is whatever the engine answered.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import re
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bot.gateway.app import Gateway
from tests.gateway_scripted import Gateways, ScriptedEngine, json_response

pytestmark = pytest.mark.faults

BUDGET = 16
COSTLY = json.dumps({"model": "m", "prompt": [1, 2, 3], "max_tokens": 100}).encode()  # 103 tokens
INFERENCE = ("/v1/completions", "/v1/chat/completions")
CHAT_BODY = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
).encode()


class Engine(ScriptedEngine):
    """The scripted engine, also answering the engine paths the gateway passes through."""

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/health", "/ping", "/version", "/tokenize", "/detokenize"):
            self.requests.append(request)
            return json_response(200, {"engine_path": request.url.path})
        return await super().__call__(request)


@dataclass
class Answer:
    """What came back on the socket."""

    status: int
    headers: dict[str, str]
    body: bytes

    def error_code(self) -> str | None:
        try:
            return json.loads(self.body)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            return None


async def raw_request(base: str, method: str, target: str, body: bytes = b"") -> Answer:
    """Send ``target`` byte for byte as the request target; the whole response."""
    url = urlsplit(base)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    head = (
        f"{method} {target} HTTP/1.1\r\nHost: {url.netloc}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + body)
    await writer.drain()
    data = await reader.read()
    writer.close()
    await writer.wait_closed()
    head_bytes, _, rest = data.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        rest = _dechunk(rest)
    return Answer(int(lines[0].split()[1]), headers, rest)


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2 :]
    return out


@pytest.fixture
async def make_gateway() -> AsyncIterator[Callable[..., Awaitable[tuple[str, Gateway]]]]:
    """Start gateways in front of scripted engines; stop them after the test."""
    async with Gateways() as gateways:
        yield gateways.start


@pytest.mark.parametrize(
    "target",
    [
        "/v1/./completions",
        "/v1/x/../completions",
        "/v1/completions/.",
        "/v1/chat/./completions",
        "/v1/completions/",
        "/./v1/completions",
        "/../v1/completions",
        "/v1/%2e/completions",
        "/v1/%2E%2E/v1/completions",
        "/v1%2fcompletions",
        "/v1%2Fchat%2Fcompletions",
        "/v1/%63ompletions",
        "/v1//completions",
        "//v1/completions",
        "/v1\\completions",
        "/v1/completions%00",
    ],
)
async def test_no_spelling_of_an_inference_path_bypasses_the_budget(
    make_gateway, target: str
) -> None:
    engine = Engine()
    base, app = await make_gateway(engine, max_inflight_tokens=BUDGET)
    body = CHAT_BODY if "chat" in target else COSTLY
    answer = await raw_request(base, "POST", target, body)
    plain = await raw_request(base, "POST", "/v1/completions", COSTLY)
    assert plain.status == 413 and plain.error_code() == "exceeds_budget"
    assert answer.status in (400, 404), (answer.status, answer.body)
    assert engine.requests == [] and app.budget.in_flight_tokens == 0
    if answer.status == 400:
        assert answer.error_code() == "ambiguous_path"


@pytest.mark.parametrize("method", ["GET", "OPTIONS", "POST"])
async def test_an_asterisk_request_target_is_a_400_not_a_500(make_gateway, method: str) -> None:
    engine = Engine()
    base, _ = await make_gateway(engine)
    answer = await raw_request(base, method, "*")
    assert answer.status == 400 and answer.error_code() == "ambiguous_path"
    assert engine.requests == []


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("POST", "/v1/embeddings"),
        ("POST", "/invocations"),  # vLLM dispatches it to completions or chat by the body
        ("POST", "/v1/responses"),
        ("POST", "/pooling"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/v1/load_lora_adapter"),
        ("GET", "/v1/models/"),
        ("GET", "/V1/models"),
    ],
)
async def test_paths_the_gateway_does_not_know_are_a_404_never_forwarded(
    make_gateway, method: str, target: str
) -> None:
    engine = Engine()
    base, _ = await make_gateway(engine, max_inflight_tokens=BUDGET)
    answer = await raw_request(base, method, target, COSTLY)
    assert answer.status == 404 and answer.error_code() == "not_found"
    assert "/v1/models" in json.loads(answer.body)["error"]["message"]
    assert engine.requests == []


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("GET", "/v1/completions"),
        ("PUT", "/v1/chat/completions"),
        ("POST", "/metrics"),
        ("DELETE", "/v1/models"),
        ("GET", "/tokenize"),
    ],
)
async def test_a_known_path_with_the_wrong_method_is_a_405(
    make_gateway, method: str, target: str
) -> None:
    engine = Engine()
    base, _ = await make_gateway(engine, max_inflight_tokens=BUDGET)
    answer = await raw_request(base, method, target, COSTLY)
    assert answer.status == 405 and answer.headers.get("allow")
    assert engine.requests == []


@pytest.mark.parametrize(
    ("method", "target", "body"),
    [
        ("GET", "/v1/models", b""),
        ("GET", "/v1/models?x=/../completions", b""),
        ("GET", "/health", b""),
        ("HEAD", "/health", b""),
        ("GET", "/ping", b""),
        ("GET", "/version", b""),
        ("POST", "/tokenize", b'{"model": "m", "prompt": "hi"}'),
        ("POST", "/detokenize", b'{"model": "m", "tokens": [1]}'),
    ],
)
async def test_the_engine_paths_the_gateway_knows_pass_through_as_sent(
    make_gateway, method: str, target: str, body: bytes
) -> None:
    engine = Engine()
    base, _ = await make_gateway(engine, max_inflight_tokens=BUDGET)
    answer = await raw_request(base, method, target, body)
    assert answer.status == 200
    assert len(engine.requests) == 1 and engine.requests[0].method == method
    assert engine.requests[0].url.raw_path == target.encode()


# --- the property: any spelling either is refused or reaches what its normalised path names ---

ROUTES = {  # (method, normalised path) -> which of the gateway's handlers serves it
    ("POST", "/v1/completions"): "inference",
    ("POST", "/v1/chat/completions"): "inference",
    ("GET", "/metrics"): "metrics",
    ("GET", "/admin/limits"): "admin",
    ("GET", "/v1/models"): "engine",
    ("GET", "/health"): "engine",
    ("POST", "/tokenize"): "engine",
}
SEGMENT_MUTATIONS = ("dot", "dotdot", "double", "trailing", "trailing_dot", "prefix_up")


def normalised(target: str) -> str:
    """The most lenient reading of a target any server behind the gateway could make."""
    path = target.split("?", 1)[0]
    for _ in range(3):  # decoded again and again: %252e is %2e is .
        path = unquote(path)
    path = re.sub(r"/+", "/", path.replace("\\", "/"))
    path = posixpath.normpath(path) if path.startswith("/") else path
    return path


def handler_of(answer: Answer, engine_saw: list[httpx.Request]) -> str:
    """Which handler answered, from what came back."""
    if engine_saw:
        return "engine"
    if answer.status == 413 and answer.error_code() == "exceeds_budget":
        return "inference"
    if answer.status == 401 and answer.error_code() == "invalid_admin_token":
        return "admin"
    if answer.status == 200 and b"ruleloop_gateway_" in answer.body:
        return "metrics"
    return f"unknown ({answer.status} {answer.body[:200]!r})"


@st.composite
def spellings(draw: st.DrawFn) -> tuple[str, str]:
    """(method, a spelling of one of the gateway's paths), mutated up to four times."""
    method, path = draw(st.sampled_from(sorted(ROUTES)))
    for _ in range(draw(st.sampled_from((0, 0, 1, 1, 1, 2, 3, 4)))):
        kind = draw(st.sampled_from((*SEGMENT_MUTATIONS, "encode", "slash", "case", "query")))
        cut = [m.start() for m in re.finditer("/", path)]
        at = draw(st.sampled_from(cut)) if cut else 0
        if kind == "dot":
            path = path[:at] + "/." + path[at:]
        elif kind == "dotdot":
            path = path[:at] + "/x/.." + path[at:]
        elif kind == "double":
            path = path[:at] + "/" + path[at:]
        elif kind == "trailing":
            path += "/"
        elif kind == "trailing_dot":
            path += draw(st.sampled_from(("/.", "/..", "/%2e", "/%2E%2e")))
        elif kind == "prefix_up":
            path = draw(st.sampled_from(("/..", "/.", "/%2e%2e", "/.%2e"))) + path
        elif kind == "encode":
            i = draw(st.integers(0, len(path) - 1))
            code = draw(st.sampled_from(("%{:02X}", "%{:02x}", "%25{:02X}")))
            path = path[:i] + code.format(ord(path[i])) + path[i + 1 :]
        elif kind == "slash" and cut:
            new = draw(st.sampled_from(("%2f", "%2F", "\\", "%5c", "%5C", "/;/")))
            path = path[:at] + new + path[at + 1 :]
        elif kind == "case":
            path = path.upper() if draw(st.booleans()) else path.title()
        elif kind == "query" and "?" not in path:
            path += "?" + draw(st.sampled_from(("x=/../completions", "a=1", "%2e%2e", "")))
    return method, path


@contextmanager
def gateway_in_a_thread(engine: ScriptedEngine) -> Iterator[tuple[str, asyncio.AbstractEventLoop]]:
    """A real gateway served from its own event loop, for hypothesis' synchronous examples."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    gateways = Gateways()
    try:
        base, _ = asyncio.run_coroutine_threadsafe(
            gateways.start(engine, max_inflight_tokens=BUDGET), loop
        ).result(timeout=30)
        yield base, loop
    finally:
        asyncio.run_coroutine_threadsafe(gateways.__aexit__(), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


def test_every_spelling_is_refused_or_served_by_the_handler_its_normalised_path_names() -> None:
    engine = Engine()
    with gateway_in_a_thread(engine) as (base, loop):

        @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
        @given(spelling=spellings())
        def check(spelling: tuple[str, str]) -> None:
            method, target = spelling
            engine.requests.clear()
            body = CHAT_BODY if "chat" in target.lower() else COSTLY
            if method == "GET":
                body = b""
            answer = asyncio.run_coroutine_threadsafe(
                raw_request(base, method, target, body), loop
            ).result(timeout=30)
            event(f"{answer.status} {handler_of(answer, engine.requests)[:9]}")
            name = normalised(target)
            expected = ROUTES.get((method, name))
            upstream_view = httpx.URL("http://engine" + target).path
            if name in INFERENCE or upstream_view in INFERENCE:
                # the budget holds for whatever the engine would take as an inference path
                assert not any(r.url.path in INFERENCE for r in engine.requests), target
            if answer.status in (400, 404, 405):
                assert engine.requests == [], target
                plain = (method, target.split("?")[0])
                assert plain not in ROUTES, f"the plain path {target} was refused"
                return
            assert handler_of(answer, engine.requests) == expected, (method, target, name)
            if engine.requests:  # passed through as sent, not tidied on the way
                sent = [r.url.raw_path.partition(b"?")[0] for r in engine.requests]
                assert sent == [target.partition("?")[0].encode()], target

        check()
