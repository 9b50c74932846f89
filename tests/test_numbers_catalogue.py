"""The typed classes keep explicit fields for mypy; these tests hold each to the catalogue, so a
number added to ``bot.kernel.numbers.catalogue`` without its field (or a field without its record)
fails here, by name."""

from __future__ import annotations

import dataclasses
import typing

from bot.adr.models import AdrGates, MatrixMetric, MatrixRow
from bot.adr.parse import MATRIX_COLUMNS
from bot.canary.verdict import Gates, Values
from bot.kernel.numbers import catalogue
from bot.kernel.numbers.catalogue import GATE_OF, KEYS, METRIC_OF, METRICS
from bot.kernel.numbers.text import FOUR as FOUR_ROWS
from bot.kernel.numbers.text import show, unit_of


def test_adr_gates_are_the_catalogues_gates():
    assert tuple(AdrGates.model_fields) == (
        *(m.gate for m in METRICS), "confidence", "inconclusive"
    )


def test_canary_gates_are_the_adrs_gates_and_the_error_gate():
    fields = tuple(f.name for f in dataclasses.fields(Gates))
    assert fields == (
        "limits", "max_error_rate", "ratios", "before", "confidence", "decide", "looks"
    )  # fmt: skip
    gates = Gates.of(**{m.gate: 1.0 for m in METRICS})
    assert [gates.limit(m.gate) for m in METRICS] == [1.0] * len(METRICS)
    assert gates.limit("max_error_rate") == gates.max_error_rate  # always on


def test_canary_values_hold_each_catalogue_number_first():
    fields = tuple(f.name for f in dataclasses.fields(Values))
    assert fields[: len(METRICS)] == KEYS
    headline = tuple(m.key for m in catalogue.HEADLINE)
    # every number, not only the headline's: a gate 'Nx before' multiplies any of them
    assert tuple(Values(*(1.0,) * len(headline)).numbers()) == KEYS


def test_matrix_row_has_a_column_per_catalogue_number():
    kept = ("config", "verdict", "bounds", "spans")
    numbers = tuple(k for k in MatrixRow.model_fields if k not in kept)
    columns = tuple(m.key for m in catalogue.MATRIX)
    assert numbers == columns
    assert typing.get_args(MatrixMetric) == columns
    assert MATRIX_COLUMNS[1:-1] == tuple(m.column for m in catalogue.MATRIX)


def test_gate_of_and_metric_of_are_inverse_and_name_the_direction():
    assert {v: k for k, v in GATE_OF.items()} == METRIC_OF
    for m in METRICS:
        assert m.gate == f"{m.gate_kind}_{m.key}", m.key


def test_each_number_is_written_in_its_records_unit():
    assert [unit_of(m.key) for m in METRICS] == [m.unit for m in METRICS]
    assert tuple((m.key, m.label, m.unit, m.worse_up) for m in catalogue.HEADLINE) == FOUR_ROWS
    assert (show("ttft_p99_ms", 1710.0), show("goodput_ratio", 0.93)) == ("1,710 ms", "93.0 %")
    assert catalogue.BY_KEY["goodput_ratio"].phrase == "goodput"
