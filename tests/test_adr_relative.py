"""Values relative to a target's normal ('3x normal'): parsing, refusals, matching, resolving."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from bot.adr.match import check, match
from bot.adr.models import GATE_METRICS, AdrGates, Condition
from bot.adr.parse import load, parse
from bot.adr.relative import NORMAL_METRICS, NoNormal, Relative
from bot.adr.render import render
from bot.adr.validate import validate
from bot.app.scheduler.snapshots import KEYS
from bot.diagnosis.models import GATE_OF
from bot.kernel.errors import AdrError
from bot.kernel.numbers import Measured

SEED = Path(__file__).parent.parent / "adr" / "ADR-20260831-01-kv-cache-paging-throughput.md"
SEED_TEXT = SEED.read_text(encoding="utf-8")
RELATIVE_FRONT = """match:
- metric: tpot_p99_ms
  op: '>'
  value: 3x normal
- metric: goodput_ratio
  op: <
  value: 0.8
"""
RELATIVE_GATES = """gates:
  max_ttft_p99_ms: 350.0
  max_tpot_p99_ms: 2x normal
  min_goodput_ratio: 0.95
"""


def _relative_seed(match_text: str = RELATIVE_FRONT, gates_text: str = RELATIVE_GATES) -> str:
    text = SEED_TEXT.replace(
        "match:\n- metric: ttft_p99_ms\n  op: '>'\n  value: 1000.0\n"
        "- metric: goodput_ratio\n  op: <\n  value: 0.8\n",
        match_text,
    )
    text = text.replace(
        "gates:\n  max_ttft_p99_ms: 350.0\n  max_tpot_p99_ms: 35.0\n  min_goodput_ratio: 0.95\n",
        gates_text,
    )
    assert match_text in text and gates_text in text
    return text


def report(**metrics: float) -> Measured:
    """A diagnosis report: the readings matching reads, by metric name."""
    return Measured.of(metrics)


# --- parsing, rendering, refusals -----------------------------------------------------------
def test_relative_values_parse_and_render_back_byte_for_byte() -> None:
    text = _relative_seed()
    adr = parse(text)
    assert adr.match[0] == Condition(metric="tpot_p99_ms", op=">", value=Relative(3.0))
    assert adr.match[1].value == 0.8  # the absolute form still works beside it
    assert adr.gates == AdrGates(
        max_ttft_p99_ms=350, max_tpot_p99_ms=Relative(2.0), min_goodput_ratio=0.95
    )
    assert render(adr) == text
    assert parse(render(adr)) == adr


def test_relative_spellings_are_read_as_one_value_and_written_canonically() -> None:
    for spelling in ("1.5x normal", "1.5 x normal", " 1.5x  normal "):
        assert Condition(metric="ttft_p99_ms", op=">", value=spelling).value == Relative(1.5)
    adr = parse(_relative_seed(gates_text="gates:\n  max_tpot_p99_ms: 2.50 x normal\n"))
    assert "max_tpot_p99_ms: 2.5x normal\n" in render(adr)


@pytest.mark.parametrize(
    ("match_text", "gates_text", "field", "why"),
    [
        (
            RELATIVE_FRONT.replace("3x normal", "three times normal"),
            RELATIVE_GATES,
            "match.0.value",
            "'three times normal' is not a number (e.g. 300 or 0.95), a multiple of the "
            "target's normal written like '3x normal'",
        ),
        (
            RELATIVE_FRONT.replace("3x normal", "x3 normal"),
            RELATIVE_GATES,
            "match.0.value",
            "written like '3x normal'",
        ),
        (
            RELATIVE_FRONT.replace("3x normal", "3x baseline"),
            RELATIVE_GATES,
            "match.0.value",
            "written like '3x normal'",
        ),
        (
            RELATIVE_FRONT.replace("3x normal", "'300'"),
            RELATIVE_GATES,
            "match.0.value",
            "(write the number without quotes)",
        ),
        (
            RELATIVE_FRONT.replace("3x normal", "0x normal"),
            RELATIVE_GATES,
            "match.0.value",
            "the multiple of normal must be greater than 0",
        ),
        (
            RELATIVE_FRONT,
            RELATIVE_GATES.replace("2x normal", "-2x normal"),
            "gates.max_tpot_p99_ms",
            "written like '3x normal'",
        ),
        (
            RELATIVE_FRONT,
            RELATIVE_GATES.replace("2x normal", "true"),
            "gates.max_tpot_p99_ms",
            "True is not a number",
        ),
        (
            RELATIVE_FRONT,
            RELATIVE_GATES.replace("2x normal", "0"),
            "gates.max_tpot_p99_ms",
            "a latency limit must be greater than 0",
        ),
    ],
    ids=[
        "words", "factor-after-x", "not-normal", "quoted-number", "zero-factor",
        "negative-gate", "bool-gate", "zero-gate",
    ],
)  # fmt: skip
def test_bad_relative_values_are_refused_naming_field_and_what_is_allowed(
    match_text: str, gates_text: str, field: str, why: str
) -> None:
    with pytest.raises(AdrError) as caught:
        parse(_relative_seed(match_text, gates_text), file="adr/broken.md")
    assert caught.value.field == field
    assert why in caught.value.why


def test_only_the_numbers_a_snapshot_keeps_can_be_relative(monkeypatch: pytest.MonkeyPatch) -> None:
    assert NORMAL_METRICS == KEYS
    assert {metric: gate for gate, metric in GATE_METRICS.items()} == GATE_OF
    # every catalogue number has a normal today; one added without (normal=False) is refused
    monkeypatch.setattr("bot.adr.models.NORMAL_METRICS", ("ttft_p99_ms", "goodput_ratio"))
    with pytest.raises(AdrError) as caught:
        parse(_relative_seed(), file="adr/broken.md")
    assert caught.value.field == "match.0.value"
    assert caught.value.why == (
        "tpot_p99_ms cannot be '3x normal': normal is measured only for ttft_p99_ms, "
        "goodput_ratio (use a number for tpot_p99_ms)"
    )


# --- matching against normal ----------------------------------------------------------------
def test_a_relative_condition_holds_over_its_multiple_of_normal() -> None:
    condition = Condition(metric="tpot_p99_ms", op=">", value="3x normal")
    normal = Measured.of({"tpot_p99_ms": 20.0, "ttft_p99_ms": 40.0})
    above = check(condition, report(tpot_p99_ms=71.0), normal)
    assert above.holds and above.limit == 60.0
    assert above.explain() == "tpot_p99_ms 71 > 3x normal (= 60): holds"
    below = check(condition, report(tpot_p99_ms=59.0), normal)
    assert not below.holds
    assert below.explain() == "tpot_p99_ms 59 > 3x normal (= 60): does not hold"


@pytest.mark.parametrize(
    "normal", [None, {}, {"tpot_p99_ms": None}, {"ttft_p99_ms": 40.0}], ids=str
)
def test_a_relative_condition_without_a_normal_does_not_hold_and_says_so(
    normal: dict[str, float | None] | None,
) -> None:
    condition = Condition(metric="tpot_p99_ms", op=">", value="3x normal")
    result = check(condition, report(tpot_p99_ms=500.0), None if normal is None else Measured.of(normal))
    assert not result.holds and result.limit is None
    assert result.explain() == "tpot_p99_ms > 3x normal: no normal measured for tpot_p99_ms"


def test_an_adr_with_relative_and_absolute_conditions_needs_both() -> None:
    adr = parse(_relative_seed())
    normal = Measured.of({"tpot_p99_ms": 20.0})
    assert match(adr, report(tpot_p99_ms=71.0, goodput_ratio=0.5), normal).matches
    assert not match(adr, report(tpot_p99_ms=71.0, goodput_ratio=0.9), normal).matches
    assert not match(adr, report(tpot_p99_ms=71.0, goodput_ratio=0.5)).matches  # no normal
    absolute = load(SEED)  # numbers only: normal changes nothing
    assert match(absolute, report(ttft_p99_ms=1200.0, goodput_ratio=0.5), normal).matches


# --- gates: resolving against normal --------------------------------------------------------
def test_relative_gates_resolve_to_numbers_and_absolute_ones_stay() -> None:
    gates = AdrGates(
        max_ttft_p99_ms=350, max_tpot_p99_ms="2x normal", min_goodput_ratio="0.9x normal"
    )
    resolved = gates.resolve({"tpot_p99_ms": 9.9, "goodput_ratio": 0.98})
    assert (resolved.max_ttft_p99_ms, resolved.max_tpot_p99_ms) == (350.0, 19.8)
    assert resolved.min_goodput_ratio == pytest.approx(0.882)
    assert resolved.relative() == {} and gates.relative() == {
        "max_tpot_p99_ms": Relative(2.0),
        "min_goodput_ratio": Relative(0.9),
    }
    assert AdrGates(max_tpot_p99_ms=35).resolve({}) == AdrGates(max_tpot_p99_ms=35)


def test_a_resolved_ratio_stays_a_ratio() -> None:
    gates = AdrGates(min_goodput_ratio="1.2x normal", max_kv_fragmentation="3x normal")
    resolved = gates.resolve({"goodput_ratio": 0.9, "kv_fragmentation": 0.5})
    assert (resolved.min_goodput_ratio, resolved.max_kv_fragmentation) == (1.0, 1.0)


def test_a_relative_gate_without_normal_is_an_error_naming_the_metric() -> None:
    gates = AdrGates(max_tpot_p99_ms="2x normal", min_goodput_ratio=0.8)
    with pytest.raises(NoNormal) as caught:
        gates.resolve({"ttft_p99_ms": 40.0})
    why = str(caught.value)
    assert "max_tpot_p99_ms is 2x normal but no normal measured for tpot_p99_ms" in why
    assert "[scheduler] snapshot_every_s" in why
    with pytest.raises(NoNormal, match="the normal tpot_p99_ms is 0"):
        gates.resolve({"tpot_p99_ms": 0.0})
    # where only showing is at stake, the unresolvable gate is left out instead
    assert gates.resolve({}, strict=False) == AdrGates(min_goodput_ratio=0.8)


def test_latency_checker_flags_name_the_relative_gates_they_cannot_render() -> None:
    gates = AdrGates(max_tpot_p99_ms="2x normal", min_goodput_ratio=0.8)
    assert gates.cli_flags() == (
        "--min-goodput-ratio 0.8  "
        "# no flag until resolved against what it multiplies: max_tpot_p99_ms 2x normal"
    )
    resolved = gates.resolve({"tpot_p99_ms": 9.9})
    assert resolved.cli_flags() == "--max-tpot-p99-ms 19.8 --min-goodput-ratio 0.8"
    assert gates.describe(resolved) == {
        "max_tpot_p99_ms": "2x normal (= 19.8)",
        "min_goodput_ratio": "0.8",
    }


def test_the_guides_relative_example_is_valid_and_explained_as_the_code_explains_it() -> None:
    guide = (Path(__file__).parent.parent / "docs" / "writing-adrs.md").read_text()
    (block,) = [b for b in re.findall(r"^```yaml\n(.*?)^```$", guide, flags=re.M | re.S)
                if "x normal" in b]  # fmt: skip
    data = yaml.safe_load(block)
    (condition,) = [Condition.model_validate(c) for c in data["match"]]
    gates = AdrGates.model_validate(data["gates"])
    assert gates.relative() == {"max_tpot_p99_ms": Relative(0.5, "before")}
    normal = Measured.of({"tpot_p99_ms": 9.9})
    shown = check(condition, report(tpot_p99_ms=185.4), normal).explain()
    assert f"`{shown}`" in guide
    assert f"`{check(condition, report(tpot_p99_ms=185.4)).explain()}`" in guide
    resolved = gates.resolve({}, before={"tpot_p99_ms": 1710.0})
    assert "(= 855 ms)" in guide and resolved.max_tpot_p99_ms == pytest.approx(855.0)


def test_resolved_limits_carry_no_float_noise_into_cards_and_drafts() -> None:
    resolved = AdrGates(max_tpot_p99_ms="6x normal").resolve({"tpot_p99_ms": 9.9})
    assert repr(resolved.max_tpot_p99_ms) == "59.4"  # 6 * 9.9 is 59.400000000000006


# --- like for like: gates relative to the before-run, never to the engine's normal ----------
def test_a_gate_relative_to_the_before_run_resolves_against_that_canary() -> None:
    gates = AdrGates(max_tpot_p99_ms="0.5x before", min_goodput_ratio=0.8)
    assert gates.relative() == {"max_tpot_p99_ms": Relative(0.5, "before")}
    assert "max_tpot_p99_ms: 0.5x before" in render(
        parse(_relative_seed(gates_text="gates:\n  max_tpot_p99_ms: 0.5x before\n"))
    )
    # the slow machine's numbers: the before-run's TPOT p99 1,710 ms, the fix's 214.8 ms
    resolved = gates.resolve({}, before={"tpot_p99_ms": 1710.0})
    assert resolved.max_tpot_p99_ms == 855.0 and resolved.max_tpot_p99_ms >= 214.8
    assert gates.describe(resolved)["max_tpot_p99_ms"] == "0.5x before (= 855)"
    assert gates.describe()["max_tpot_p99_ms"] == "0.5x before (after the before-run)"
    # the engine's normal is no substitute for the before-run
    with pytest.raises(NoNormal, match="no before-run measured it"):
        gates.resolve({"tpot_p99_ms": 9.9})
    with pytest.raises(NoNormal, match="the before-run measured no tpot_p99_ms"):
        gates.resolve({}, before={"tpot_p99_ms": None})


def test_a_match_condition_cannot_be_relative_to_a_before_run() -> None:
    with pytest.raises(AdrError) as caught:
        parse(_relative_seed(RELATIVE_FRONT.replace("3x normal", "3x before")), file="a.md")
    assert caught.value.field == "match.0.value"
    assert "write '3x normal'" in caught.value.why and "only in gates" in caught.value.why


def test_adr_validate_refuses_a_gate_relative_to_the_engines_normal(tmp_path: Path) -> None:
    adr = tmp_path / SEED.name
    adr.write_text(_relative_seed(), encoding="utf-8")  # max_tpot_p99_ms: 2x normal
    (problem,) = validate(adr)
    assert problem.field == "gates.max_tpot_p99_ms"
    assert "client-side p99" in problem.why and "engine's histogram" in problem.why
    assert "'0.5x before'" in problem.why  # what to write instead
    adr.write_text(
        _relative_seed(gates_text=RELATIVE_GATES.replace("2x normal", "0.5x before")),
        encoding="utf-8",
    )
    assert validate(adr) == []
