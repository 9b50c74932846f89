"""ADR record: render -> parse round trips, and the parser's refusals (file, field, why)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from bot.adr.models import Adr, AdrGates, Condition, Fix, GatewayRules, MatrixRow
from bot.adr.parse import load, parse
from bot.adr.render import format_ms, format_pct, render
from bot.kernel.errors import AdrError
from bot.kernel.numbers.reading import Bound

SEED = Path(__file__).parent.parent / "adr" / "ADR-20260831-01-kv-cache-paging-throughput.md"


def _record(**changes: object) -> Adr:
    fields: dict[str, object] = {
        "id": "ADR-20261129-02",
        "title": "Prefix caching for agent prompts | long system prompt",
        "status": "proposed",
        "date": dt.date(2026, 11, 29),
        "deciders": ["alice", "bob"],
        "supersedes": ["ADR-20260831-01"],
        "match": [Condition(metric="tpot_p99_ms", op=">=", value=35)],
        "fix": Fix(
            engine_args={
                "enable-prefix-caching": True,
                "max-num-seqs": 64,
                "gpu-memory-utilization": 0.9,
            },
            gateway=GatewayRules(require_request_timeout=True, max_in_flight_tokens=65536),
        ),
        "gates": AdrGates(max_tpot_p99_ms=35, min_goodput_ratio=0.95),
        "context": "Agents send a 3k-token system prompt.\n\nChats slowed down: TPOT p99 118 ms.",
        "matrix": [
            MatrixRow(
                config="baseline: `--max-num-batched-tokens 8192`",
                ttft_p99_ms=412.37,
                tpot_p99_ms=118.04,
                goodput_ratio=0.99871,
                kv_fragmentation=0.1234,
                verdict="不达标 (fail: TPOT p99 118ms > 35ms)",
            ),
            MatrixRow(
                config="mnbt-512 | chunked",
                ttft_p99_ms=None,
                tpot_p99_ms=None,
                verdict="引擎拒绝 (refused by vLLM): ValueError: No common block size for 48",
            ),
        ],
        "matrix_notes": "TTFT / TPOT: client-side p99.",
        "rules": ["First rule.", "A rule\nover two lines."],
        "notes": "## 4. Follow-ups\n\n- measure on a GPU",
    }
    return Adr(**(fields | changes))


@pytest.mark.parametrize(
    "record",
    [
        _record(),
        _record(gates=None, match=[], supersedes=[], notes="", matrix_notes="", context=""),
        _record(fix=Fix(), rules=[], matrix=[]),
        _record(status="accepted", title="vLLM 推理引擎 KV Cache 换页与吞吐调优决策"),
        _record(guardrails="block"),
    ],
    ids=["full", "minimal-front-matter", "empty-body-parts", "chinese-title", "guardrails"],
)
def test_render_parse_round_trip_gives_same_record(record: Adr) -> None:
    text = render(record)
    assert parse(text) == record
    assert render(parse(text)) == text


def test_a_matrix_row_keeps_its_bounds_and_spans_through_markdown() -> None:
    row = MatrixRow(
        config="事故现场 (incident)",
        ttft_p99_ms=20_000.0,
        tpot_p99_ms=10.0,
        goodput_ratio=0.9,
        kv_fragmentation=0.12,
        bounds={"ttft_p99_ms": Bound.MORE_THAN, "tpot_p99_ms": Bound.AT_MOST},
        spans={"kv_fragmentation": (0.0, 0.24), "goodput_ratio": (0.85, 0.95)},
    )
    record = _record(matrix=[row])
    text = render(record)
    assert "| >20000ms | ≤10ms | 90% (85-95%) | 12% (0-24%) |" in text
    assert parse(text) == record
    # a hand-written '<=' reads as the same bound; a broken span is refused with the form to use
    assert parse(text.replace("≤10ms", "<=10ms")) == record
    with pytest.raises(AdrError, match=r"an estimate like 95% \(0-95%\)"):
        parse(text.replace("12% (0-24%)", "12% (0-x)"))


def test_seed_adr_parses_and_renders_back_byte_for_byte() -> None:
    adr = load(SEED)
    assert (adr.id, adr.status) == ("ADR-20260831-01", "accepted")
    assert adr.fix.engine_args == {
        "enable-chunked-prefill": True,
        "max-num-batched-tokens": 2048,
        "block-size": 32,
    }
    assert (
        adr.fix.gateway is not None
        and adr.fix.gateway.require_request_timeout
        and adr.fix.gateway.drop_on_cancel
    )
    assert adr.gates == AdrGates(max_ttft_p99_ms=350, max_tpot_p99_ms=35, min_goodput_ratio=0.95)
    assert [
        (r.ttft_p99_ms, r.tpot_p99_ms, r.goodput_ratio, r.kv_fragmentation) for r in adr.matrix
    ] == [
        (1200, 45, 0.62, 0.184),
        (850, 32, 0.81, 0.092),
        (310, 28, 0.96, 0.041),
    ]
    assert render(adr) == SEED.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("value", "ms", "pct"),
    [
        (None, "-", "-"),
        (1200.0, "1200ms", "120000%"),
        (117.84, "117.8ms", "11784%"),
        (0.184, "0.2ms", "18.4%"),
        (0.62, "0.6ms", "62%"),
    ],
)
def test_matrix_cells_format_at_table_precision(value: float | None, ms: str, pct: str) -> None:
    assert (format_ms(value), format_pct(value)) == (ms, pct)


def test_matrix_values_are_held_at_table_precision() -> None:
    row = MatrixRow(config="x", ttft_p99_ms=117.849, goodput_ratio=0.99871)
    assert (row.ttft_p99_ms, row.goodput_ratio) == (117.8, 0.999)


def _break(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


SEED_TEXT = SEED.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("text", "field", "why"),
    [
        ("no front matter\n", "front matter", "must start with a '---' line"),
        (
            _break(SEED_TEXT, "status: accepted", "status: [accepted"),
            "front matter",
            "not valid YAML",
        ),
        (_break(SEED_TEXT, "status: accepted", "status: approved"), "status", "Input should be"),
        (_break(SEED_TEXT, "id: ADR-20260831-01", "id: ADR-1"), "id", "should match pattern"),
        (_break(SEED_TEXT, "deciders:", "owners:"), "owners", "unknown field"),
        (
            _break(SEED_TEXT, "metric: ttft_p99_ms", "metric: ttft"),
            "match.0.metric",
            "unknown metric 'ttft'",
        ),
        (_break(SEED_TEXT, "op: '>'", "op: '=~'"), "match.0.op", "unknown operator '=~'"),
        (
            _break(SEED_TEXT, "value: 1000.0", "value: 'ttft > 1000'"),
            "match.0.value",
            "is not a number (e.g. 300 or 0.95), a multiple of the target's normal",
        ),
        (
            _break(SEED_TEXT, "min_goodput_ratio: 0.95", "min_goodput_ratio: 95"),
            "gates.min_goodput_ratio",
            "a ratio must be between 0 and 1",
        ),
        (
            _break(SEED_TEXT, "# ADR-20260831-01: vLLM", "# ADR-20260831-02: vLLM"),
            "heading",
            "first line of the body",
        ),
        (
            _break(SEED_TEXT, "## 2. 实验对比数据 (Metrics Matrix)", "## 2. Metrics"),
            "body",
            "the seed's sections",
        ),
        (
            _break(SEED_TEXT, "| 1200ms |", "| 1200 |"),
            "matrix row 1, TTFT (P99)",
            "'1200' is not a value like 350ms",
        ),
        (
            _break(SEED_TEXT, "| 62% |", "| 162% |"),
            "matrix.0.goodput_ratio",
            "less than or equal to 1",
        ),
        (_break(SEED_TEXT, "| 45ms | 62% |", "| 45ms |"), "matrix row 1", "has 5 cells, needs 6"),
        (_break(SEED_TEXT, "| 结论 |", "| Verdict |"), "matrix", "the table header must be"),
        (_break(SEED_TEXT, "- 强制启用", "强制启用"), "rules", "each rule is a '- ' list item"),
        (
            _break(SEED_TEXT, "gates:\n", "guardrails: stop\ngates:\n"),
            "guardrails",
            "'warn' or 'block'",
        ),
        (
            _break(SEED_TEXT, "gates:\n", "gates:\n  confidence: 1.5\n"),
            "gates.confidence",
            "from 0.8 to 0.999 (99 % is 0.99, the default)",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None,
)
def test_parse_refuses_broken_adr_naming_field_and_why(text: str, field: str, why: str) -> None:
    with pytest.raises(AdrError) as caught:
        parse(text, file="adr/broken.md")
    assert caught.value.file == "adr/broken.md"
    assert caught.value.field == field
    assert why in caught.value.why
    assert str(caught.value).startswith(f"adr/broken.md: {field}: ")


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"context": "fine\n## 4. sneaky"}, "would start a new section"),
        ({"matrix_notes": "| a | b |"}, "would be read as a Metrics Matrix row"),
        ({"notes": "text without a heading"}, "must start with a '## ' heading"),
        ({"title": "two\nlines"}, "must be one line"),
        ({"supersedes": ["ADR-bad"]}, "is not an ADR id"),
    ],
)
def test_record_refuses_body_text_that_would_not_round_trip(
    changes: dict[str, object], why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        Adr.model_validate(_record().model_dump() | changes)


def test_supersedes_accepts_a_single_id() -> None:
    assert _record(supersedes="ADR-20260831-01").supersedes == ["ADR-20260831-01"]


def test_the_gates_confidence_round_trips_and_is_left_out_when_unset() -> None:
    seed = parse(SEED_TEXT, file="adr/seed.md")
    assert seed.gates is not None and seed.gates.confidence is None
    assert "confidence" not in render(seed)
    sure = seed.model_copy(update={"gates": seed.gates.model_copy(update={"confidence": 0.95})})
    text = render(sure)
    assert "  confidence: 0.95\n" in text
    back = parse(text, file="adr/seed.md")
    assert back.gates is not None and back.gates.confidence == 0.95 and back == sure
