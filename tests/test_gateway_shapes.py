"""The gateway's request records: kept per admitted request in a bounded buffer, exported at
/admin/requests behind the admin token, never holding content; and their conversion into a
workload shape (groups from the prefix hashes, burstiness from the gaps, vLLM's edges).

The gateway is real (uvicorn, real HTTP) in front of the scripted engine (tests/gateway_scripted);
the gateway's wall clock is replaced where a test needs known arrival times.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from bot.adr.workload import shape as shapes
from bot.adr.workload.shape import PrefixGroup
from bot.diagnosis.probes.gateway_capture import (
    Request,
    burstiness,
    capture_from_gateway,
    histogram,
    prefix_groups,
    shape_from_export,
    vllm_edges,
)
from bot.gateway.app import Gateway
from bot.gateway.limits import Limits
from bot.gateway.records import CHAR_LEVELS, EXPORT_VERSION, TOKEN_LEVELS, Recorder
from bot.gateway.server import GatewayServer
from bot.kernel.errors import ProbeError, UsageError
from tests.gateway_scripted import ADMIN_TOKEN, ScriptedEngine
from tests.workload_pages import VLLM_EDGES

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SECRET = "the launch code is hunter2 and nobody may know it"
LEVELS = {"tokens": list(TOKEN_LEVELS), "chars": list(CHAR_LEVELS)}

Start = Callable[..., Awaitable[tuple[str, Gateway]]]


class Clock:
    """A wall clock the test moves: each request arrives at the next of ``times``."""

    def __init__(self, times: list[float]) -> None:
        self.times = iter(times)
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def next(self) -> None:
        self.now = next(self.times)


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    opened: list[tuple[GatewayServer, httpx.AsyncClient]] = []

    async def start(
        engine: ScriptedEngine, *, records: int = 10_000, token: str | None = ADMIN_TOKEN
    ) -> tuple[str, Gateway]:
        upstream = httpx.AsyncClient(transport=httpx.MockTransport(engine), base_url="http://e")
        app = Gateway(client=upstream, limits=Limits(), admin_token=token, record_requests=records)
        server = GatewayServer(app)
        await server.__aenter__()
        opened.append((server, upstream))
        return server.base_url, app

    yield start
    for server, upstream in reversed(opened):
        await server.__aexit__(None, None, None)
        await upstream.aclose()


def ids(prefix: int, tail: int, seed: int) -> list[int]:
    """A token-id prompt: ``prefix`` ids shared by every caller, then ``tail`` of its own."""
    rng = random.Random(seed)
    return list(range(1000, 1000 + prefix)) + [rng.randrange(5000, 30000) for _ in range(tail)]


async def export(client: httpx.AsyncClient, base: str, **params: object) -> dict[str, object]:
    response = await client.get(f"{base}/admin/requests", headers=AUTH, params=params)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    data = response.json()
    assert isinstance(data, dict)
    return data


async def test_each_admitted_request_is_recorded_without_its_content(start: Start) -> None:
    base, _ = await start(ScriptedEngine())
    system = "You are a helpful assistant. " * 40  # 1,160 characters
    async with httpx.AsyncClient() as client:
        stream = {"model": "m", "prompt": ids(200, 10, 1), "max_tokens": 5, "stream": True}
        assert (await client.post(f"{base}/v1/completions", json=stream)).status_code == 200
        plain = {"model": "m", "prompt": ids(70, 0, 2), "max_tokens": 7}
        assert (await client.post(f"{base}/v1/completions", json=plain)).status_code == 200
        text = {"model": "m", "prompt": SECRET * 30, "max_tokens": 2, "stream": True}
        assert (await client.post(f"{base}/v1/completions", json=text)).status_code == 200
        chat = {"model": "m", "max_tokens": 3, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": SECRET}]}  # fmt: skip
        assert (await client.post(f"{base}/v1/chat/completions", json=chat)).status_code == 200
        refused = {"model": "m", "prompt": "x", "max_tokens": 0}  # invalid: never admitted
        assert (await client.post(f"{base}/v1/completions", json=refused)).status_code == 400
        raw = (await client.get(f"{base}/admin/requests", headers=AUTH)).text
    data = json.loads(raw)
    assert data["version"] == EXPORT_VERSION and data["kind"] == "ruleloop.gateway.requests"
    assert (data["recorded"], data["evicted"], data["max_records"]) == (4, 0, 10_000)
    streamed, whole, texted, chatted = data["records"]
    # the engine's usage (3 prompt tokens, in every scripted event) wins when the stream has it
    assert (streamed["prompt_tokens"], streamed["prompt_tokens_from"]) == (3, "usage")
    assert (streamed["output_tokens"], streamed["output_tokens_from"]) == (5, "usage")
    assert (streamed["api"], streamed["outcome"], streamed["prefix_unit"]) == (
        "completions", "ok", "tokens")  # fmt: skip
    assert len(streamed["prefix_hashes"]) == 2  # 210 ids reach the 64 and 128 levels
    # a token-id prompt without usage in the answer: its length, exact
    assert (whole["prompt_tokens"], whole["prompt_tokens_from"]) == (70, "ids")
    assert (whole["output_tokens"], whole["output_tokens_from"]) == (7, "usage")
    assert len(whole["prefix_hashes"]) == 1
    # text: hashed in character levels, its length in characters kept to convert them
    assert texted["prefix_unit"] == "chars" and texted["prompt_chars"] == len(SECRET) * 30
    assert len(texted["prefix_hashes"]) == sum(1 for c in CHAR_LEVELS if c <= len(SECRET) * 30)
    assert chatted["api"] == "chat" and chatted["prefix_unit"] == "chars"
    assert chatted["prompt_tokens_from"] == "estimate"  # no usage.prompt_tokens in the answer
    assert all(len(h) == 16 for r in data["records"] for h in r["prefix_hashes"])
    # no content: not the text, not a piece of it, not the ids
    for needle in (SECRET, "hunter2", "helpful assistant", "1000, 1001", "[1000,"):
        assert needle not in raw
    assert set(streamed) == {
        "at", "api", "outcome", "duration_s", "prompt_tokens", "prompt_tokens_from",
        "output_tokens", "output_tokens_from", "prefix_unit", "prefix_hashes", "prompt_chars",
    }  # fmt: skip


async def test_shared_prefixes_hash_alike_and_others_do_not(start: Start) -> None:
    base, _ = await start(ScriptedEngine())
    async with httpx.AsyncClient() as client:
        for seed in range(3):  # 300 shared ids then their own: alike up to the 256 level
            body = {"model": "m", "prompt": ids(300, 300, seed), "max_tokens": 1}
            assert (await client.post(f"{base}/v1/completions", json=body)).status_code == 200
        data = await export(client, base)
    a, b, c = (r["prefix_hashes"] for r in data["records"])
    assert len(a) == len(b) == len(c) == 4  # 64, 128, 256, 512 of 600 ids
    assert a[:3] == b[:3] == c[:3]
    assert len({a[3], b[3], c[3]}) == 3


async def test_the_buffer_keeps_the_newest_and_counts_the_evicted(start: Start) -> None:
    base, app = await start(ScriptedEngine(), records=3)
    async with httpx.AsyncClient() as client:
        for n in range(1, 6):
            body = {"model": "m", "prompt": [1] * n, "max_tokens": 1}
            assert (await client.post(f"{base}/v1/completions", json=body)).status_code == 200
        data = await export(client, base)
    assert [r["prompt_tokens"] for r in data["records"]] == [3, 4, 5]
    assert (data["recorded"], data["evicted"], data["exported"]) == (5, 2, 3)
    assert len(app.recorder.records) == 3


async def test_last_s_exports_only_the_last_stretch(start: Start) -> None:
    base, app = await start(ScriptedEngine())
    clock = Clock([100.0, 200.0, 300.0, 400.0])
    app.recorder.wall_clock = clock
    async with httpx.AsyncClient() as client:
        for _ in range(3):
            clock.next()
            body = {"model": "m", "prompt": [1, 2], "max_tokens": 1}
            assert (await client.post(f"{base}/v1/completions", json=body)).status_code == 200
        clock.next()  # now 400: the last 150 s hold the request of 300 only
        data = await export(client, base, last_s=150)
        bad = await client.get(f"{base}/admin/requests", headers=AUTH, params={"last_s": "-1"})
    assert [r["at"] for r in data["records"]] == [300.0] and data["now"] == 400.0
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "last_s"


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer wrong"}, 401), ({"Authorization": ADMIN_TOKEN}, 401)],
)
async def test_the_export_needs_the_admin_token(
    start: Start, headers: dict[str, str], status: int
) -> None:
    base, _ = await start(ScriptedEngine())
    async with httpx.AsyncClient() as client:
        body = {"model": "m", "prompt": SECRET, "max_tokens": 1}
        await client.post(f"{base}/v1/completions", json=body)
        response = await client.get(f"{base}/admin/requests", headers=headers)
        posted = await client.post(f"{base}/admin/requests", headers=AUTH)
    assert response.status_code == status and "records" not in response.text
    assert response.json()["error"]["code"] == "invalid_admin_token"
    assert posted.status_code == 405


async def test_without_an_admin_token_the_export_is_disabled(start: Start) -> None:
    base, _ = await start(ScriptedEngine(), token=None)
    async with httpx.AsyncClient() as client:
        response = await client.get(f"{base}/admin/requests", headers=AUTH)
    assert response.status_code == 403 and response.json()["error"]["code"] == "admin_disabled"


async def test_recording_can_be_off(start: Start) -> None:
    base, app = await start(ScriptedEngine(), records=0)
    async with httpx.AsyncClient() as client:
        await client.post(
            f"{base}/v1/completions", json={"model": "m", "prompt": [1], "max_tokens": 1}
        )
        data = await export(client, base)
    assert data["records"] == [] and data["recorded"] == 0 and not app.recorder.records


async def test_a_large_export_streams_whole(start: Start) -> None:
    """Thousands of records leave in chunks and parse as one JSON document."""
    base, app = await start(ScriptedEngine())
    for i in range(2_345):
        app.recorder.record(
            body={"prompt": list(range(i % 300))}, chat=False, at=float(i), outcome="ok",
            duration_s=0.1, prompt_tokens=i % 300, prompt_from="ids", output_tokens=1,
            output_from="usage",
        )  # fmt: skip
    async with httpx.AsyncClient() as client:
        data = await export(client, base)
    records = data["records"]
    assert isinstance(records, list) and len(records) == 2_345
    assert [r["at"] for r in records] == [float(i) for i in range(2_345)]


# --- the converter -------------------------------------------------------------------------


def req(at: float, *, prompt: int = 100, output: int = 10, hashes: tuple[str, ...] = (),
        unit: str | None = "tokens", outcome: str = "ok", api: str = "completions",
        chars: int | None = None, duration: float = 1.0) -> Request:  # fmt: skip
    return Request(at=at, api=api, outcome=outcome, duration_s=duration, prompt_tokens=prompt,
                   output_tokens=output, unit=unit, hashes=hashes, prompt_chars=chars)  # fmt: skip


def test_groups_are_found_at_the_deepest_shared_level() -> None:
    requests = (
        # 6 behind one 256-token system prompt (levels 64, 128, 256 shared), own tails beyond
        [req(i, hashes=("s1", "s2", "s3", f"own{i}")) for i in range(6)]
        # 2 of them continue one conversation: they share 512 as well
        + [req(10 + i, hashes=("s1", "s2", "s3", "conv", f"c{i}")) for i in range(2)]
        # 2 share only 64 tokens with each other
        + [req(20 + i, hashes=("t1", f"u{i}")) for i in range(2)]
        # 10 share nothing
        + [req(30 + i, hashes=(f"lone{i}",)) for i in range(10)]
    )
    groups = prefix_groups(requests, LEVELS)
    assert groups == (
        PrefixGroup(share=0.3, length=256),
        PrefixGroup(share=0.1, length=512),
        PrefixGroup(share=0.1, length=64),
    )


def test_text_groups_convert_characters_to_tokens() -> None:
    # 1024-character level (256 tokens at 4 a token), but these prompts run 5 chars a token
    requests = [req(i, prompt=800, unit="chars", chars=4000, hashes=("a", "b", "c", f"d{i}"))
                for i in range(4)]  # fmt: skip
    assert prefix_groups(requests, LEVELS) == (PrefixGroup(share=1.0, length=205),)


def test_small_groups_are_left_out() -> None:
    requests = [req(i, hashes=(f"x{i}",)) for i in range(300)] + [
        req(400 + i, hashes=("pair",)) for i in range(2)
    ]
    assert prefix_groups(requests, LEVELS) == ()  # 2 of 302 is under 1 %


@pytest.mark.parametrize(
    ("gaps", "want"),
    [
        ([1.0] * 20, 100.0),  # evenly spaced: no variance, as even as it gets
        ([0.5, 1.5] * 10, 4.0),  # mean 1, variance 0.25
        ([0.0, 2.0] * 10, 1.0),  # mean 1, variance 1: as Poisson's
        ([0.1] * 18 + [9.1, 9.1], 0.137),  # clumps, then long pauses: mean 1, variance 7.29
    ],
)
def test_burstiness_is_mean_squared_over_variance_of_the_gaps(
    gaps: list[float], want: float
) -> None:
    arrivals = list(itertools.accumulate(gaps, initial=1000.0))
    random.Random(3).shuffle(arrivals)  # the order records come in does not matter
    assert burstiness(arrivals) == pytest.approx(want, abs=0.001)


def test_burstiness_needs_enough_gaps() -> None:
    assert burstiness([float(i) for i in range(10)]) is None  # 9 gaps
    assert burstiness([float(i) for i in range(11)]) == 100.0


def test_lengths_are_binned_on_vllms_edges() -> None:
    assert vllm_edges(3000)[:-1] == [float(e) for e in VLLM_EDGES]
    assert vllm_edges(3000)[-1] == float("inf")
    assert vllm_edges(30_000)[-2] == 50_000.0
    h = histogram([1, 2, 3, 100, 101, 20_000])
    assert (h.cumulative[2.0], h.cumulative[5.0], h.cumulative[100.0], h.cumulative[200.0]) == (
        2.0, 3.0, 4.0, 5.0)  # fmt: skip
    assert max(h.cumulative) == float("inf") and h.cumulative[20_000.0] == h.count == 6.0
    assert h.total == 20_207


def export_of(records: list[dict[str, object]], **extra: object) -> dict[str, object]:
    return {"version": 1, "kind": "ruleloop.gateway.requests", "now": 2_000_000_000.0,
            "prefix_levels": LEVELS, "evicted": 0, "records": records, **extra}  # fmt: skip


def record(at: float, **fields: object) -> dict[str, object]:
    return {"at": at, "api": "completions", "outcome": "ok", "duration_s": 2.0,
            "prompt_tokens": 100, "output_tokens": 16, "prefix_unit": "tokens",
            "prefix_hashes": [], "prompt_chars": None, **fields}  # fmt: skip


def test_a_shape_from_records() -> None:
    records = [record(float(i), prompt_tokens=90 if i % 2 else 900, prefix_hashes=["s", f"{i}"])
               for i in range(40)]  # fmt: skip
    records += [record(40.0, outcome="client_cancel", prompt_tokens=50_000, output_tokens=3)]
    shape = shape_from_export(export_of(records), url="http://gw:9000")
    # lengths of the 40 that finished; the cancelled one counts only as an arrival
    assert shape.prompt_tokens.count == 40 and shape.prompt_tokens.buckets["100"] == 0.5
    assert shape.prompt_tokens.buckets["1000"] == 0.5 and "+Inf" in shape.prompt_tokens.buckets
    assert list(shape.prompt_tokens.buckets)[:-1] == [str(e) for e in VLLM_EDGES]
    assert shape.output_tokens.buckets["20"] == 1.0
    assert shape.arrivals.request_rate == 1.0  # 41 arrivals, 1 s apart
    assert shape.arrivals.burstiness == 100.0  # evenly spaced
    assert shape.arrivals.concurrency == pytest.approx(41 * 2.0 / 42.0, abs=1e-3)
    assert shape.prefix.groups == (PrefixGroup(share=0.9756, length=64),)  # 40 of 41
    assert shape.prefix.hit_rate is None and shape.api == "completions"
    assert shape.source == "gateway http://gw:9000 over 40 s (41 requests)"
    assert shape.captured_at.timestamp() == 2_000_000_000.0


def test_a_shape_diffs_edge_by_edge_with_one_from_metrics() -> None:
    from bot.adr.workload.diff import diff
    from tests.workload_pages import shape as metrics_shape

    prompts = [90 if i % 2 else 900 for i in range(40)]
    gateway = shape_from_export(
        export_of([record(float(i), prompt_tokens=p) for i, p in enumerate(prompts)]),
        url="http://gw:9000",
    )
    metrics = metrics_shape(prompts, [16] * 40, rate=1.0, hit_rate=None)
    assert not diff(metrics, gateway).drifted
    assert gateway.prompt_tokens.buckets == metrics.prompt_tokens.buckets


@pytest.mark.parametrize(
    ("data", "error", "message"),
    [
        (export_of([record(1.0)]), UsageError, "holds 1 request record(s): a shape needs two"),
        (export_of([record(1.0, outcome="deadline"), record(2.0, outcome="deadline")]),
         UsageError, "no request finished"),
        (export_of([record(1.0)], version=2), ProbeError, "version 2; this ruleloop reads version 1"),
        ({"records": []}, ProbeError, "did not answer with the gateway's request records"),
        (export_of([{"at": 1.0}]), ProbeError, "a request record is malformed"),
    ],
)  # fmt: skip
def test_unusable_exports_are_refused(data: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        shape_from_export(data, url="http://gw:9000")


# --- end to end: the gateway, its export, the CLI -------------------------------------------


async def test_capture_through_a_gateway(start: Start, tmp_path: Path) -> None:
    """Requests with known arrivals through a real gateway, captured by the CLI."""
    base, app = await start(ScriptedEngine())
    gaps = [0.5, 1.5] * 15  # burstiness 4
    arrivals = list(itertools.accumulate(gaps, initial=1_000.0))
    clock = Clock([*arrivals, arrivals[-1] + 1])
    app.recorder.wall_clock = clock
    async with httpx.AsyncClient() as client:
        for i in range(len(arrivals)):
            clock.next()
            shared = 1024 if i % 3 else 64  # two in three behind a 1,024-token prefix
            body = {"model": "m", "prompt": ids(shared, 40, i), "max_tokens": 8, "stream": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
            assert (await client.post(f"{base}/v1/completions", json=body)).status_code == 200
    clock.next()
    token = tmp_path / "token"
    token.write_text(ADMIN_TOKEN + "\n")
    out = tmp_path / "gw.yaml"

    def run(*args: str) -> tuple[int, str]:
        from bot.app.cli import cli

        result = CliRunner().invoke(cli, ["workload", "capture", *args])
        assert "Traceback" not in result.output
        return result.exit_code, result.output

    code, output = await asyncio.to_thread(
        run, "--gateway", base, "--token-file", str(token), "-o", str(out)
    )
    assert code == 0, output
    assert "prefix groups: 64.5% behind 1,024 tokens, 35.5% behind 64 tokens" in output
    assert "burstiness: 4 (gamma shape; 1 is Poisson)" in output
    shape = shapes.load(out)
    assert shape.arrivals.burstiness == pytest.approx(4.0)
    assert shape.arrivals.request_rate == 1.0
    assert shape.prompt_tokens.count == 31 and shape.output_tokens.buckets["10"] == 1.0
    # the scripted engine's usage says 3 prompt tokens for every request
    assert shape.prompt_tokens.buckets["5"] == 1.0
    assert shape.prefix.groups == (PrefixGroup(share=0.6451, length=1024),
                                   PrefixGroup(share=0.3548, length=64))  # fmt: skip
    assert shape.source.startswith(f"gateway {base} over 30 s (31 requests")
    # the wrong token, and no token at all, are refused with exit 2
    token.write_text("wrong")
    code, output = await asyncio.to_thread(
        run, "--gateway", base, "--token-file", str(token), "-o", str(tmp_path / "x.yaml")
    )
    assert code == 2 and "refused the admin token (HTTP 401)" in output
    code, output = await asyncio.to_thread(run, "--gateway", base, "-o", str(tmp_path / "x.yaml"))
    assert code == 2 and "--gateway needs the gateway's admin token" in output


async def test_capture_from_a_gateway_that_is_down() -> None:
    from bot.engine.process import free_port
    from bot.kernel.errors import EndpointError

    url = f"http://127.0.0.1:{free_port()}"
    async with httpx.AsyncClient() as client:
        with pytest.raises(EndpointError, match=f"cannot reach the gateway at {url}"):
            await capture_from_gateway(client, url, token="x")


def test_the_recorder_alone_hashes_batches_on_their_first_prompt() -> None:
    recorder = Recorder(4)
    recorder.record(body={"prompt": [list(range(64)), [9] * 64]}, chat=False, at=1.0,
                    outcome="ok", duration_s=1.0, prompt_tokens=128, prompt_from="ids",
                    output_tokens=1, output_from="usage")  # fmt: skip
    recorder.record(body={"prompt": list(range(64))}, chat=False, at=2.0, outcome="ok",
                    duration_s=1.0, prompt_tokens=64, prompt_from="ids", output_tokens=1,
                    output_from="usage")  # fmt: skip
    first, second = recorder.records
    assert first[9] == second[9] and len(first[9]) == 1
