"""Fuzz the runbook condition grammar (bot/diagnosis/runbooks/conditions.py) and the hypotheses
that use it: any text either parses into a condition or is refused with a ValueError that says
what to write; a condition that parses is judged three-valued over any readings without raising,
and ``and`` / ``or`` keep their meaning (checked against Python's own on decided clauses)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from bot.diagnosis.runbooks.conditions import RunbookCondition, parse
from bot.diagnosis.runbooks.models import Hypothesis
from bot.kernel.numbers.reading import Bound, Reading
from tests.fuzzing import examples

pytestmark = pytest.mark.faults

FUZZ = settings(
    max_examples=examples(1_500), deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
NAMES = st.sampled_from(["vllm_metrics.tpot_p99_ms", "queue.waiting", "a.b", "x_1.y_2"])
OPS = st.sampled_from(["<", "<=", ">", ">=", "==", "!="])
NUMBERS = st.sampled_from(["0", "1", "-2.5", "3e2", "1E-3", "0.0", "99999999999999999999"])
CLAUSES = st.tuples(NAMES, OPS, NUMBERS, st.sampled_from([" ", ""])).map(
    lambda t: f"{t[0]}{t[3]}{t[1]}{t[3]}{t[2]}"
)
VALID = st.lists(CLAUSES, min_size=1, max_size=4).flatmap(
    lambda cs: st.lists(st.sampled_from(["and", "or"]), min_size=len(cs) - 1,
                        max_size=len(cs) - 1).map(
        lambda js: " ".join(c + (f" {j}" if i < len(js) else "")
                            for i, (c, j) in enumerate(zip(cs, [*js, ""], strict=True)))
    )
)  # fmt: skip
PIECES = st.sampled_from(["and", "or", "not", "(", ")", "a.b", ".", "<", "<<", "=", "==", "1",
                          "nan", "inf", "-", "e", "x", " ", "  ", "\t", "\n", "{", "}", "é", ""])
TEXT = st.text(max_size=40) | st.lists(PIECES, max_size=12).map(" ".join) | VALID


def read_from(values: dict[str, float | None]):  # type: ignore[no-untyped-def]
    def read(name: str) -> Reading | None:
        value = values.get(name)
        return None if value is None else Reading(value)

    return read


READINGS = st.dictionaries(
    NAMES, st.none() | st.floats(allow_nan=True, allow_infinity=True), max_size=4
)


@FUZZ
@given(text=TEXT, readings=READINGS)
def test_any_text_parses_or_is_refused_saying_what_to_write(
    text: str, readings: dict[str, float | None]
) -> None:
    try:
        condition = parse(text)
    except ValueError as exc:
        assert str(exc), text
        assert "probe.reading" in str(exc) or "write" in str(exc) or "OP" in str(exc), str(exc)
        return
    assert isinstance(condition, RunbookCondition) and condition.readings
    assert condition.holds(read_from(readings)) in (True, False, None)


@FUZZ
@given(text=VALID, readings=st.dictionaries(NAMES, st.floats(-1e3, 1e3), max_size=4))
def test_a_valid_condition_means_what_python_says_it_means(
    text: str, readings: dict[str, float]
) -> None:
    """On decided clauses (every reading measured, plain values) the three-valued judge is
    Python's own ``and`` / ``or`` with ``and`` binding tighter."""
    condition = parse(text)
    got = condition.holds(read_from(readings))
    expected = any(
        all(
            c.reading in readings and _python(readings[c.reading], c.op, c.limit)
            for c in group
        )
        for group in condition.alternatives
    )  # fmt: skip
    every_read = all(c.reading in readings for g in condition.alternatives for c in g)
    if every_read:
        assert got is expected, (text, readings)
    elif got is not None:
        assert got is expected or got is True, (text, readings)


def _python(value: float, op: str, limit: float) -> bool:
    if math.isinf(limit) or math.isnan(limit):
        return False
    return {"<": value < limit, "<=": value <= limit, ">": value > limit, ">=": value >= limit,
            "==": value == limit, "!=": value != limit}[op]  # fmt: skip


@FUZZ
@given(supported=TEXT, ruled_out=st.none() | TEXT, number=st.text(max_size=30),
       evidence=st.text(max_size=30))  # fmt: skip
def test_a_hypothesis_is_built_or_refused_by_validation_only(
    supported: str, ruled_out: str | None, number: str, evidence: str
) -> None:
    try:
        Hypothesis(cause="c", supported_when=supported, ruled_out_when=ruled_out,
                   number=number, evidence=evidence)  # fmt: skip
    except ValidationError as exc:
        assert exc.errors(), exc


def test_a_bound_that_cannot_decide_leaves_the_condition_undecided() -> None:
    """The fuzz above reads plain values; a bound (a histogram's '≤ 10') can leave it open."""
    condition = parse("vllm_metrics.tpot_p99_ms > 5")
    bounded = Reading(10.0, Bound.AT_MOST)
    assert condition.holds(lambda name: bounded) is None
