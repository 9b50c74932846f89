"""SSE parsing cost per event: bot.kernel.runtime.sse beside what it replaced and beside httpx-sse.

    python bench/sse_bench.py [--events 100000] [--rounds 5] [--httpx-sse DIR]

Feeds a vLLM-shaped completion chunk (continuous usage, ~260 bytes) in four framings: one
event per read with LF, the same with CRLF, 16 events per read, and each event split over two
reads. Rows: ``runtime.sse`` (the one parser: events with decoded data); ``old canary`` (the
hand-rolled ``\\n\\n`` split it replaced: LF only, so CRLF finds nothing); ``relay now`` (what
the gateway does per read: the parser, the bytes to hold back, the end marker); ``old gateway``
(the relay's old boundary check, no parsing at all); ``httpx-sse`` (its line and event
decoders behind an incremental UTF-8 decoder; importable, or from ``--httpx-sse DIR`` as
``pip install --target DIR httpx-sse`` leaves it). Prints microseconds per event (the best of
``--rounds``, rows interleaved: the box is shared) and each row's ratio to runtime.sse, all from
the same run.
"""

from __future__ import annotations

import argparse
import codecs
import json
import sys
import time
from collections.abc import Callable, Iterable

from bot.kernel.runtime.sse import DONE, SSEParser

CHUNK = {
    "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "text": " t1", "logprobs": None, "finish_reason": None,
                 "stop_reason": None}],
    "usage": {"prompt_tokens": 512, "completion_tokens": 3, "total_tokens": 515},
}  # fmt: skip
EVENT = b"data: " + json.dumps(CHUNK).encode() + b"\n\n"

Feed = Callable[[bytes], int | None]  # one read in, events found out (None: it finds none)


def ours() -> Feed:
    parser = SSEParser()
    return lambda chunk: len(parser.feed(chunk))


def relay() -> Feed:
    """bot/gateway/relay.py now: events from the parser, the bytes to hold back, the marker."""
    parser, held = SSEParser(), [b""]

    def feed(chunk: bytes) -> None:
        found = parser.feed(chunk)
        end = bool(found) and found[-1].data == DONE
        data = held[0] + chunk if held[0] else chunk
        if parser.pending:
            cut = len(data) - parser.pending
            data, held[0] = data[:cut], data[cut:]
        del end

    return feed


def old_canary() -> Feed:
    """bot/canary/client.py before: split on LF LF, then keep the data: lines."""
    state = [b""]

    def feed(chunk: bytes) -> int:
        buffer, found = state[0] + chunk, 0
        while (end := buffer.find(b"\n\n")) >= 0:
            event, buffer = buffer[:end], buffer[end + 2 :]
            found += sum(1 for line in event.split(b"\n") if line.startswith(b"data:"))
        state[0] = buffer
        return found

    return feed


def old_gateway() -> Feed:
    """bot/gateway/relay.py before: where the last whole event ends, and the end marker."""
    held = [b""]

    def feed(chunk: bytes) -> None:
        data = held[0] + chunk
        if data.endswith(b"\n\n"):
            cut = len(data)
        else:
            lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
            cut = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        held[0] = data[cut:]
        data.endswith(b"data: [DONE]\n\n")

    return feed


def httpx_sse_feed() -> Feed:
    from httpx_sse._decoders import SSEDecoder, SSELineDecoder

    text = codecs.getincrementaldecoder("utf-8")("replace")
    lines, events = SSELineDecoder(), SSEDecoder()

    def feed(chunk: bytes) -> int:
        found = 0
        for line in lines.decode(text.decode(chunk)):
            if events.decode(line) is not None:
                found += 1
        return found

    return feed


def framings(n: int) -> dict[str, tuple[list[bytes], int]]:
    """Name -> (the reads, events in them)."""
    crlf = EVENT.replace(b"\n", b"\r\n")
    half = len(EVENT) // 2
    return {
        "1 event/read LF": ([EVENT] * n, n),
        "1 event/read CRLF": ([crlf] * n, n),
        "16 events/read LF": ([EVENT * 16] * (n // 16), n // 16 * 16),
        "event in 2 reads LF": ([EVENT[:half], EVENT[half:]] * n, n),
    }


def per_event_us(
    make: Callable[[], Feed], reads: Iterable[bytes], events: int
) -> tuple[float, int | None]:
    feed = make()
    start = time.perf_counter()
    counts = [feed(chunk) for chunk in reads]
    found = None if counts and counts[0] is None else sum(c or 0 for c in counts)
    return (time.perf_counter() - start) / events * 1e6, found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--httpx-sse", default=None, help="a folder holding httpx_sse")
    args = ap.parse_args()
    if args.httpx_sse:
        sys.path.insert(0, args.httpx_sse)
    rows: dict[str, Callable[[], Feed]] = {
        "runtime.sse": ours, "old canary": old_canary, "relay now": relay,
        "old gateway": old_gateway,
    }  # fmt: skip
    try:
        import httpx_sse  # noqa: F401

        rows["httpx-sse"] = httpx_sse_feed
    except ImportError:
        print("httpx-sse not importable: its row is left out (--httpx-sse DIR)")
    for framing, (reads, events) in framings(args.events).items():
        print(f"\n{framing} ({events:,} events of {len(EVENT)} bytes, best of {args.rounds})")
        best: dict[str, float] = {}
        found: dict[str, int | None] = {}
        for _ in range(args.rounds):  # rows interleaved, so a noisy moment hits all of them
            for name, make in rows.items():
                if name == "old canary" and "CRLF" in framing:
                    continue  # it finds no event there and piles every read onto its buffer
                us, found[name] = per_event_us(make, reads, events)
                best[name] = min(us, best.get(name, us))
        base = best["runtime.sse"]
        for name in rows:
            if name not in best:
                print(f"  {name:<12} finds no event: LF LF never comes")
                continue
            miss = found[name] not in (events, None)
            note = f"  (found {found[name]:,} of {events:,} events)" if miss else ""
            print(f"  {name:<12} {best[name]:6.3f} us/event  {best[name] / base:5.2f}x{note}")


if __name__ == "__main__":
    main()
