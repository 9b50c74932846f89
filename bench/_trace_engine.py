"""A scripted OpenAI-style SSE server for bench/gateway_trace.py --fake-engine (no vLLM needed).

    python bench/_trace_engine.py PORT [PREFILL_S] [STEP_S]

Answers ``GET /v1/models``, ``GET /metrics`` (vLLM's token and request counters) and streaming
chat requests like vLLM: the response head at once,
the first token event after PREFILL_S (15 ms), then one event every STEP_S (20 ms), each with
continuous usage, then ``[DONE]``; keep-alive connections. With $RULELOOP_ENGINE_TRACE set, it
appends ``engine_got <ns> <id>`` and ``engine_wrote <ns> <id>`` (request parsed, first token
written) for requests that carry an ``x-trace-id`` header.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

PREFILL_S = float(sys.argv[2]) if len(sys.argv) > 2 else 0.015
STEP_S = float(sys.argv[3]) if len(sys.argv) > 3 else 0.02
MODELS = b'{"object":"list","data":[{"id":"tiny-llama"}]}'
COUNTS = {"generated": 0, "running": 0}
TRACE = os.environ.get("RULELOOP_ENGINE_TRACE")
LOG = open(TRACE, "a", buffering=1) if TRACE else None  # noqa: SIM115


def stamp(hop: str, tid: str) -> None:
    """One line of the per-request trace (when asked for and the request has an id)."""
    if LOG is not None and tid:
        LOG.write(f"{hop} {time.time_ns()} {tid}\n")


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(i: int) -> bytes:
    """The SSE event carrying token ``i`` (0-based)."""
    payload = {
        "id": "chatcmpl-trace", "object": "chat.completion.chunk", "model": "tiny-llama",
        "choices": [{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}],
        "usage": {"prompt_tokens": 8, "total_tokens": 9 + i, "completion_tokens": i + 1},
    }  # fmt: skip
    return chunk(b"data: " + json.dumps(payload).encode() + b"\n\n")


def metrics() -> bytes:
    """The engine counters the benches read, in Prometheus' text format."""
    return (
        f'vllm:generation_tokens_total{{model_name="tiny-llama"}} {COUNTS["generated"]}.0\n'
        f'vllm:num_requests_running{{model_name="tiny-llama"}} {COUNTS["running"]}.0\n'
        f'vllm:num_requests_waiting{{model_name="tiny-llama"}} 0.0\n'
    ).encode()


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer requests on one connection until the client closes it."""
    try:
        while True:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            path = head[0].split(" ")[1]
            pairs = (h.partition(":") for h in head[1:])
            fields = {k.strip().lower(): v.strip() for k, _, v in pairs}
            body = await reader.readexactly(int(fields.get("content-length") or 0))
            if path in ("/v1/models", "/metrics"):
                page = MODELS if path == "/v1/models" else metrics()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(page), page))
                continue
            tid = fields.get("x-trace-id", "")
            stamp("engine_got", tid)
            tokens = int(json.loads(body).get("max_tokens") or 16)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip
            COUNTS["running"] += 1
            try:
                await asyncio.sleep(PREFILL_S)
                for i in range(tokens):
                    writer.write(event(i))
                    if i == 0:
                        stamp("engine_wrote", tid)
                    COUNTS["generated"] += 1
                    await writer.drain()
                    await asyncio.sleep(STEP_S if i < tokens - 1 else 0)
            finally:
                COUNTS["running"] -= 1
            writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main() -> None:
    server = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]), backlog=4096)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
