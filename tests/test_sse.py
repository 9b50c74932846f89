"""The one SSE parser (bot/kernel/runtime/sse.py) against the WHATWG event-stream rules, fed as reads."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.kernel.runtime.sse import BOM, SseEvent, SSEParser

LINE_ENDS = [b"\n", b"\r\n", b"\r"]
ENDS = pytest.mark.parametrize("end", LINE_ENDS, ids=["LF", "CRLF", "CR"])

STREAM = (
    ": a comment, then a retry and an id\n"
    "retry: 2500\n"
    "id: 7\n"
    "event: delta\n"
    "data: one\n"
    "data:two\n"
    "data:  three\n"
    "\n"
    "data\n"
    "data\n"
    "\n"
    'data: {"text": "é"}\n'
    "\n"
)
EXPECTED = [
    SseEvent("one\ntwo\n three", "delta", "7"),  # one space dropped after the colon, one only
    SseEvent("\n", "message", "7"),  # a field with no colon: its value is empty
    SseEvent('{"text": "é"}', "message", "7"),  # the id stays the stream's last one
]


def parse(reads: list[bytes]) -> list[SseEvent]:
    parser = SSEParser()
    events = [e for read in reads for e in parser.feed(read)]
    return events + parser.end()


def framed(text: str, end: bytes) -> bytes:
    return text.encode().replace(b"\n", end)


@ENDS
def test_every_line_ending_parses_the_same_events(end: bytes) -> None:
    parser = SSEParser()
    assert parser.feed(framed(STREAM, end)) == EXPECTED
    assert parser.retry_ms == 2500 and parser.pending == 0


@ENDS
def test_byte_by_byte_reads_parse_the_same_events(end: bytes) -> None:
    raw = framed(STREAM, end)
    assert parse([raw[i : i + 1] for i in range(len(raw))]) == EXPECTED


def test_one_event_per_read_the_gateways_hot_path_parses_the_same_events() -> None:
    reads = [b"id: 5\ndata: a\n\n", b"data: b\n\n", b"data: c\n\n", b"event: x\ndata: d\n\n"]
    expected = [SseEvent("a", id="5"), SseEvent("b", id="5"), SseEvent("c", id="5"), SseEvent("d", "x", "5")]
    assert parse(reads) == parse([b"".join(reads)]) == expected
    assert parse([b"data: a\n", b"\n", b"data: b\n\n"]) == [SseEvent("a"), SseEvent("b")]


def test_a_crlf_split_between_two_reads_is_one_line_end() -> None:
    # Read as two line ends, the LF would be a blank line: "a" and "b" as two events.
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\ndata: b\r") == []
    assert parser.feed(b"\n\r") == [SseEvent("a\nb")]
    assert parser.feed(b"\n") == []  # the LF of the blank line's CRLF: no second blank line
    assert parser.feed(b"data: c\r\n\r\n") == [SseEvent("c")]


def test_an_empty_read_between_a_cr_and_its_lf_keeps_them_one_line_end() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r") + parser.feed(b"") + parser.feed(b"\ndata: b\r\n\r\n") == [
        SseEvent("a\nb")
    ]


def test_an_event_framed_with_cr_is_dispatched_at_its_cr_not_at_the_next_read() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r\r") == [SseEvent("a")]


def test_comments_and_keepalives_dispatch_nothing() -> None:
    assert parse([b": ping\n\n", b":\n\n", b"data: a\n: inside\ndata: b\n\n"]) == [SseEvent("a\nb")]


def test_an_event_without_data_is_not_dispatched_and_its_type_does_not_leak() -> None:
    assert parse([b"event: x\n\ndata: y\n\n"]) == [SseEvent("y", "message")]
    assert parse([b"data:\n\n"]) == [SseEvent("")]  # an empty data line is data


def test_id_fields_set_the_last_event_id_unless_they_hold_a_nul() -> None:
    parser = SSEParser()
    events = parser.feed(b"id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\nid\ndata: c\n\n")
    assert [e.id for e in events] == ["1", "1", ""]  # NUL: ignored; no value: reset


@pytest.mark.parametrize(
    ("line", "retry"),
    [(b"retry: 3000", 3000), (b"retry:15", 15), (b"retry: 3s", None), (b"retry: -1", None),
     (b"retry: ", None), (b"retry: 1.5", None), ("retry: ３".encode(), None)],
)  # fmt: skip
def test_retry_counts_only_when_it_is_all_ascii_digits(line: bytes, retry: int | None) -> None:
    parser = SSEParser()
    parser.feed(line + b"\n\n")
    assert parser.retry_ms == retry


def test_unknown_fields_are_ignored() -> None:
    assert parse([b"foo: bar\nDATA: x\ndata : y\ndata: z\n\n"]) == [SseEvent("z")]


@pytest.mark.parametrize(
    "reads",
    [[b"data: a\n\ndata: b"], [b"data: a\n\ndata: b\n"], [b"data: a\n\ndata: b\r"]],
    ids=["no line end", "no blank line", "CR, no blank line"],
)
def test_a_last_event_without_its_blank_line_is_dispatched_at_the_end(reads: list[bytes]) -> None:
    # The spec discards it; a canary counting tokens must not (bot/kernel/runtime/sse.py says why).
    parser = SSEParser()
    assert parser.feed(reads[0]) == [SseEvent("a")]
    assert parser.end() == [SseEvent("b")]
    assert parser.end() == []


def test_the_end_of_a_stream_that_left_nothing_open_dispatches_nothing() -> None:
    parser = SSEParser()
    parser.feed(b"data: a\n\n: bye\n")
    assert parser.end() == []


@pytest.mark.parametrize("split", [1, 2, 3])
def test_a_bom_at_the_start_is_skipped_even_split_over_reads(split: int) -> None:
    raw = BOM + b"data: a\n\n"
    assert parse([raw[:split], raw[split:]]) == [SseEvent("a")]
    assert parse([raw[i : i + 1] for i in range(len(raw))]) == [SseEvent("a")]


def test_only_the_first_bom_is_skipped() -> None:
    # A second BOM is part of the field name, which then is no "data" field.
    assert parse([BOM + BOM + b"data: a\n\ndata: b\n\n"]) == [SseEvent("b")]
    assert parse([b"data: a\n\n" + BOM + b"data: b\n\n"]) == [SseEvent("a")]


def test_utf8_split_between_reads_decodes_whole_and_bad_bytes_are_replaced() -> None:
    raw = "data: é€\n\n".encode()
    assert parse([raw[:7], raw[7:9], raw[9:]]) == [SseEvent("é€")]
    assert parse([b"data: \xff\n\n"]) == [SseEvent("\ufffd")]


def test_pending_counts_the_bytes_of_the_event_not_yet_complete() -> None:
    parser = SSEParser()
    parser.feed(b"data: a\n\ndata: b")
    assert parser.pending == len(b"data: b")
    parser.feed(b"\r")
    assert parser.pending == len(b"data: b\r")
    parser.feed(b"\n\r")
    assert parser.pending == 0  # the blank line's CR ended the event
    parser.feed(b"\n")
    assert parser.pending == 1  # the LF of that CRLF came after it


# -- property: any events, any of the three line endings, any reads -------------------------

TEXT = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)))
NAMES = st.text(
    st.characters(blacklist_characters="\r\n:", blacklist_categories=("Cs",)), min_size=1
)
IDS = st.text(st.characters(blacklist_characters="\r\n\0", blacklist_categories=("Cs",)))
Spec = tuple[list[str], str | None, str | None, str | None, bool]  # as EVENTS draws one
EVENTS = st.lists(
    st.tuples(
        st.lists(TEXT, min_size=1, max_size=3),  # data lines
        st.none() | NAMES,  # event type
        st.none() | IDS,  # id
        st.none() | TEXT,  # a comment
        st.booleans(),  # "data:value" instead of "data: value" where that means the same
    ),
    max_size=6,
)


def serialize(events: list[Spec]) -> str:
    out = []
    for lines, kind, id_, comment, tight in events:
        out += [] if comment is None else [":" + comment]
        out += [] if kind is None else ["event: " + kind]
        out += [] if id_ is None else ["id: " + id_]
        out += [("data:" if tight and line[:1] != " " else "data: ") + line for line in lines]
        out.append("")
    return "".join(line + "\n" for line in out)


def expected(events: list[Spec]) -> list[SseEvent]:
    last_id, out = "", []
    for lines, kind, id_, _, _ in events:
        last_id = last_id if id_ is None else id_
        out.append(SseEvent("\n".join(lines), kind or "message", last_id))
    return out


@settings(max_examples=300, deadline=None)
@given(
    events=EVENTS,
    end=st.sampled_from(LINE_ENDS),
    bom=st.booleans(),
    tail=st.sampled_from(["blank line", "line end", "nothing"]),
    per_event=st.booleans(),
    data=st.data(),
)
def test_any_events_with_any_line_ending_split_anywhere_parse_back(
    events: list[Spec],
    end: bytes,
    bom: bool,
    tail: str,
    per_event: bool,
    data: st.DataObject,
) -> None:
    start = BOM if bom else b""
    raw = start + framed(serialize(events), end)
    if events and tail != "blank line":  # the last event without its blank line
        raw = raw[: -len(end) if tail == "line end" else -2 * len(end)]
    if per_event:  # one read per event, as the gateway mostly gets them
        ends = [len(start + framed(serialize(events[: i + 1]), end)) for i in range(len(events))]
        cuts = [min(cut, len(raw)) for cut in ends]
    else:
        cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=12), label="cuts"))
    reads = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert parse(reads) == expected(events)


@settings(max_examples=200, deadline=None)
@given(events=EVENTS, end=st.sampled_from(LINE_ENDS), data=st.data())
def test_a_relay_that_holds_back_pending_bytes_forwards_whole_events_only(
    events: list[Spec],
    end: bytes,
    data: st.DataObject,
) -> None:
    # What the gateway does: forward all but ``pending`` bytes of each read. Parsed on its own,
    # what it forwarded so far is exactly the events dispatched so far, with nothing left over.
    raw = framed(serialize(events), end)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=12), label="cuts"))
    parser, held, forwarded, seen = SSEParser(), b"", b"", []
    for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True):
        seen += parser.feed(raw[a:b])
        held += raw[a:b]
        cut = len(held) - parser.pending
        forwarded, held = forwarded + held[:cut], held[cut:]
        alone = SSEParser()
        assert alone.feed(forwarded) == seen and alone.end() == []
    assert forwarded + held == raw and seen == expected(events)


# -- feed_data: the events' data undecoded (the canary's reader) ------------------------------


def parse_data(reads: list[bytes]) -> list[bytes]:
    parser = SSEParser()
    out = [d for read in reads for d in parser.feed_data(read)]
    return out + [e.data.encode() for e in parser.end()]


@pytest.mark.parametrize(
    "reads",
    [
        [b"data: a\n\n", b"data: b\n\ndata: c\n\n"],  # the shortcuts: one event, several
        [b"data: a\n\n\n\ndata: b\n\n"],  # a blank line too many between them
        [b"data: a\n\ndata: b\ndata: c\n\n"],  # a second event of two data lines
        [b"data: a\n\nevent: x\ndata: b\n\n"],  # a field other than data
        [b"data: a\r\n\r\ndata: b\r\n\r\n"],  # CRLF
        [b"data: a\n\ndata: b\n"],  # the last event's blank line in the next read
        [b"data: a\n\n", b"data: b\n", b"\ndata: c\n\n"],  # an event over two reads
        [b"data: a\n\n: comment\n\ndata: b\n\n"],  # a comment between them
        [BOM + b"data: a\n\ndata: b\n\n"],  # the stream's first bytes: a BOM
        [b"data: \xff\n\ndata: b\n\n"],  # bytes that are no UTF-8 are replaced
    ],
)
def test_feed_data_gives_the_data_feed_gives_for_any_read(reads: list[bytes]) -> None:
    assert parse_data(reads) == [e.data.encode() for e in parse(reads)]


@settings(max_examples=300, deadline=None)
@given(events=EVENTS, end=st.sampled_from(LINE_ENDS), data=st.data())
def test_feed_data_of_any_events_split_anywhere_is_their_data(
    events: list[Spec], end: bytes, data: st.DataObject
) -> None:
    raw = framed(serialize(events), end)
    # Reads at event ends (whole events, several per read) or anywhere.
    ends = [len(framed(serialize(events[: i + 1]), end)) for i in range(len(events))]
    anywhere = st.lists(st.integers(0, len(raw)), max_size=12)
    cuts = sorted(data.draw(st.lists(st.sampled_from(ends)) if ends else anywhere, label="at")
                  + data.draw(anywhere, label="cuts"))  # fmt: skip
    reads = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert parse_data(reads) == [e.data.encode() for e in expected(events)]
