"""Request records: the shape of each request the gateway relayed, never its content.

For every admitted inference request the gateway keeps one record in a bounded buffer (a
deque of at most ``MAX_RECORDS``, 10,000 by default; the oldest go first), and
``GET /admin/requests`` exports them (``export``, version ``EXPORT_VERSION``) for
``ruleloop workload capture --gateway``. A record holds:

- ``at``: arrival, unix seconds (the gateway's wall clock); ``duration_s``: arrival to the
  exchange's end; ``outcome``: as the gateway's metrics count it (``ok``, ``client_cancel``,
  ``deadline``, ``upstream_error``); ``api``: ``completions`` or ``chat``;
- ``prompt_tokens`` and where the number came from (``prompt_tokens_from``): ``usage``, the
  engine's own count from the response (a non-streamed answer always has it; a stream only
  when the client asked for ``stream_options: {"include_usage": true}``), else ``ids``, a
  token-id prompt's length (exact), else ``estimate``, the admission cost's count (the
  ``--tokenizer``, or UTF-8 bytes / 4);
- ``output_tokens`` and ``output_tokens_from``: ``usage``, else ``events`` (choice events
  counted, as the gateway's metrics do);
- ``prefix_unit`` and ``prefix_hashes``: a hash of the prompt's first L units for each level L
  of ``TOKEN_LEVELS`` (64, 128, ..., 32768 tokens) that the prompt reaches, when the prompt is
  token ids; for text (a string prompt, or a chat's messages as role and text, in order) the
  levels are ``CHAR_LEVELS`` characters (4 per token, the costing's estimate), and
  ``prompt_chars`` says how long the hashed text was, so a level converts to tokens. Two
  requests with the same hash at a level share that level's prefix. A batch (a list of
  prompts) is hashed on its first prompt.

No prompt text, token id or output is stored. The hashes are chained (each level's from the
one below and the next slice, so a prompt is read once, up to its deepest level) with
Python's hash on the hot path (about 16 us to record a 2,048-token prompt, 3 us for 8,000
characters of text; after the exchange, not before it), and exported keyed: BLAKE2b with a
key drawn when the gateway starts, so an exported hash says nothing about a guessed prompt
to whoever lacks that key, and equal hashes mean equal prefixes only within one gateway
process's lifetime.

The export is streamed in chunks of ``EXPORT_CHUNK`` records with the event loop let go
between them: 10,000 records are about 0.12 s of CPU and 3.6 MB of JSON, in pieces of a few
milliseconds, so an export never stalls the streams being relayed for longer than that.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from bot.gateway.types import Send

EXPORT_VERSION = 1
EXPORT_KIND = "ruleloop.gateway.requests"
MAX_RECORDS = 10_000  # about 0.5 kB each, hashes included: ~5 MB at the most
TOKEN_LEVELS = tuple(64 * 2**k for k in range(10))  # 64 .. 32768 tokens
CHARS_PER_TOKEN = 4
CHAR_LEVELS = tuple(CHARS_PER_TOKEN * level for level in TOKEN_LEVELS)
EXPORT_CHUNK = 200  # records per body write: about 2.5 ms of serializing each
PATH = "/admin/requests"

# One record, a plain tuple (the cheapest thing to build on the hot path), in this order:
# at, chat, outcome, duration_s, prompt_tokens, prompt_from, output_tokens, output_from,
# unit ("tokens" | "chars" | None), hashes (raw, unkeyed), prompt_chars
Record = tuple[float, bool, str, float, int, str, int, str, str | None, tuple[int, ...], int | None]


def _token_hashes(ids: list[Any], seed: int) -> tuple[int, ...]:
    out = []
    h, previous, n = seed, 0, len(ids)
    for level in TOKEN_LEVELS:
        if level > n:
            break
        h = hash((h, tuple(ids[previous:level])))
        previous = level
        out.append(h)
    return tuple(out)


def _text_hashes(text: str, seed: int) -> tuple[int, ...]:
    out = []
    h, previous, n = seed, 0, len(text)
    for level in CHAR_LEVELS:
        if level > n:
            break
        h = hash((h, text[previous:level]))
        previous = level
        out.append(h)
    return tuple(out)


def _chat_text(messages: list[Any]) -> str:
    """A chat's role and text parts in order, up to the deepest character level."""
    parts: list[str] = []
    size = 0
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        texts = [content] if isinstance(content, str) else []
        if isinstance(content, list):
            texts = [
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            ]
        for text in (str(message.get("role", "")), *texts):
            parts.append(text)
            parts.append("\n")
            size += len(text) + 1
        if size >= CHAR_LEVELS[-1]:
            break
    return "".join(parts)


class Recorder:
    """The bounded buffer of request records, and its export."""

    def __init__(
        self, max_records: int = MAX_RECORDS, *, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.max_records = max_records
        self.records: deque[Record] = deque(maxlen=max_records)
        self.recorded = 0  # since the gateway started, the evicted included
        self.wall_clock = wall_clock
        self.started = wall_clock()
        self._key = os.urandom(16)
        self._seed = int.from_bytes(os.urandom(8), "little", signed=True)

    def record(
        self, *, body: dict[str, Any], chat: bool, at: float, outcome: str, duration_s: float,
        prompt_tokens: int, prompt_from: str, output_tokens: int, output_from: str,
    ) -> None:  # fmt: skip
        """Keep one request's record (the prompt is hashed here, never kept)."""
        if not self.max_records:
            return
        unit: str | None = None
        hashes: tuple[int, ...] = ()
        chars: int | None = None
        if chat:
            messages = body.get("messages")
            text = _chat_text(messages) if isinstance(messages, list) else ""
            unit, hashes, chars = "chars", _text_hashes(text, self._seed), len(text)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
                prompt = prompt[0]  # a batch: its first prompt
            if isinstance(prompt, str):
                unit, hashes, chars = "chars", _text_hashes(prompt, self._seed), len(prompt)
            elif isinstance(prompt, list):
                unit, hashes = "tokens", _token_hashes(prompt, self._seed)
        self.records.append(
            (at, chat, outcome, duration_s, prompt_tokens, prompt_from, output_tokens,
             output_from, unit, hashes, chars)
        )  # fmt: skip
        self.recorded += 1

    def _hex(self, cache: dict[int, str], raw: int) -> str:
        text = cache.get(raw)
        if text is None:
            digest = hashlib.blake2b(
                raw.to_bytes(8, "little", signed=True), digest_size=8, key=self._key
            )
            text = cache[raw] = digest.hexdigest()
        return text

    def _as_json(self, record: Record, cache: dict[int, str]) -> dict[str, object]:
        at, chat, outcome, duration, prompt, prompt_from, output, output_from = record[:8]
        unit, hashes, chars = record[8:]
        return {
            "at": round(at, 3), "api": "chat" if chat else "completions", "outcome": outcome,
            "duration_s": round(duration, 4), "prompt_tokens": prompt,
            "prompt_tokens_from": prompt_from, "output_tokens": output,
            "output_tokens_from": output_from, "prefix_unit": unit,
            "prefix_hashes": [self._hex(cache, h) for h in hashes], "prompt_chars": chars,
        }  # fmt: skip

    def header(self, now: float, kept: int) -> dict[str, object]:
        """What the export says about itself, beside its records."""
        return {
            "version": EXPORT_VERSION, "kind": EXPORT_KIND, "now": round(now, 3),
            "started": round(self.started, 3), "max_records": self.max_records,
            "recorded": self.recorded, "evicted": self.recorded - len(self.records),
            "exported": kept,
            "prefix_levels": {"tokens": list(TOKEN_LEVELS), "chars": list(CHAR_LEVELS)},
        }  # fmt: skip

    async def export(self, send: Send, *, last_s: float | None = None) -> None:
        """Stream the records (those of the last ``last_s`` seconds, or all) as one JSON
        object: the header's fields, then ``records``, oldest first."""
        now = self.wall_clock()
        records = list(self.records)
        if last_s is not None:
            since = now - last_s
            records = [r for r in records if r[0] >= since]
        head = json.dumps(self.header(now, len(records)))
        headers = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": (head[:-1] + ', "records": [').encode(),
                    "more_body": True})  # fmt: skip
        cache: dict[int, str] = {}
        for start in range(0, len(records), EXPORT_CHUNK):
            chunk = ", ".join(
                json.dumps(self._as_json(r, cache)) for r in records[start : start + EXPORT_CHUNK]
            )
            body = ((", " if start else "") + chunk).encode()
            await send({"type": "http.response.body", "body": body, "more_body": True})
            await asyncio.sleep(0)  # let the relayed streams run between chunks
        await send({"type": "http.response.body", "body": b"]}"})
