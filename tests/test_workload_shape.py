"""The workload shape file: JSON and YAML round trips, derived quantiles, bad files refused with
the field named and what is allowed there, and the example in docs/workload.md loads."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from bot.adr.workload import shape as shapes
from bot.adr.workload.shape import Lengths, ShapeError, WorkloadShape
from bot.kernel.errors import UsageError
from bot.kernel.numbers.histogram import histogram_quantile
from bot.kernel.numbers.reading import Bound
from tests.workload_pages import chat, lengths, long_system_prompt

ROOT = Path(__file__).parent.parent
GUIDE = ROOT / "docs" / "workload.md"


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
def test_round_trip(tmp_path: Path, suffix: str) -> None:
    original = long_system_prompt()
    path = tmp_path / f"shape{suffix}"
    shapes.save(original, path)
    text = path.read_text()
    if suffix == ".json":
        assert json.loads(text)["version"] == 1
    else:
        assert text.startswith("version: 1\n")
    loaded = shapes.load(path)
    assert loaded == original
    assert loaded.prompt_tokens.buckets == original.prompt_tokens.buckets
    assert loaded.captured_at == original.captured_at


def test_yaml_and_json_say_the_same(tmp_path: Path) -> None:
    original = chat()
    shapes.save(original, tmp_path / "a.json")
    shapes.save(original, tmp_path / "a.yaml")
    assert shapes.load(tmp_path / "a.json") == shapes.load(tmp_path / "a.yaml") == original


def test_quantiles_are_derived_as_prometheus_does() -> None:
    shape = long_system_prompt()
    prompt = shape.prompt_tokens
    cumulative = prompt.cumulative()
    assert math.isclose(cumulative[math.inf], 1.0)
    for name, q in shapes.QUANTILES:
        want = histogram_quantile(q, cumulative)
        assert want is not None
        assert getattr(prompt, name) == pytest.approx(want, abs=0.05)
    assert 2000 < prompt.p50 < 5000 and prompt.bounds == {}
    # the engine's own edges are all kept, empty buckets included
    assert list(prompt.buckets)[:3] == ["1", "2", "5"] and list(prompt.buckets)[-1] == "+Inf"


def test_a_quantile_in_the_first_or_last_bucket_is_a_bound() -> None:
    tiny = lengths([1] * 10)
    assert tiny.p50 == 1.0 and tiny.bounds == {k: Bound.AT_MOST for k in ("p50", "p90", "p99")}
    huge = lengths([100] * 95 + [20000] * 5)
    assert huge.bounds == {"p99": Bound.MORE_THAN}
    assert huge.p99 == 10000.0  # the last finite edge: "> 10,000"
    assert "p99 > 10,000" in huge.summary()


def test_a_file_may_leave_the_quantiles_out() -> None:
    data = json.loads(shapes.dumps(chat(), "json"))
    for key in ("p50", "p90", "p99", "bounds"):
        del data["prompt_tokens"][key]
    loaded = shapes.parse(json.dumps(data), kind="json")
    assert loaded.prompt_tokens == chat().prompt_tokens


def test_yaml_written_by_hand_with_number_edges() -> None:
    text = """\
version: 1
source: file
captured_at: 2026-09-01T12:00:00Z
api: chat
prompt_tokens:
  count: 100
  buckets: {100: 0.2, 200: 0.7, 500: 0.1, +Inf: 0}
output_tokens:
  count: 100
  buckets: {50: 0.5, 200: 0.5}
prefix:
  groups: [{share: 0.6, length: 1500}]
arrivals:
  request_rate: 3.5
"""
    shape = shapes.parse(text, kind="yaml")
    assert shape.prompt_tokens.buckets == {"100": 0.2, "200": 0.7, "500": 0.1, "+Inf": 0.0}
    assert shape.prompt_tokens.p50 == pytest.approx(100 + 100 * (0.5 - 0.2) / 0.7, abs=0.05)
    assert shape.prefix.hit_rate is None and shape.prefix.groups[0].length == 1500
    assert shape.arrivals.concurrency is None and shape.arrivals.burstiness is None


def good() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(shapes.dumps(chat(), "json"))
    return data


def put(data: dict[str, Any], dotted: str, value: object) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        data = data[part]
    if value is DELETE:
        del data[last]
    else:
        data[last] = value


DELETE = object()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("api", "grpc", "api: Input should be 'completions', 'chat' or 'unknown'"),
        ("version", 2, "version: version 2: this ruleloop reads shape version 1"),
        (
            "prompt_tokens.median",
            300,
            "prompt_tokens.median: unknown field; allowed here: count, mean, p50, p90, p99, "
            "bounds, buckets",
        ),
        ("colour", "red", "colour: unknown field; allowed here: version, source, captured_at"),
        ("captured_at", DELETE, "captured_at: required"),
        (
            "captured_at",
            "2026-09-01T12:00:00",
            "captured_at: Input should have timezone info (write e.g. 2026-09-01T12:00:00Z)",
        ),
        ("arrivals.request_rate", 0, "arrivals.request_rate: Input should be greater than 0"),
        ("prefix.hit_rate", 1.5, "prefix.hit_rate: Input should be less than or equal to 1"),
        (
            "prefix.groups",
            [{"share": 0.7, "length": 100}, {"share": 0.6, "length": 50}],
            "prefix.groups: the groups' shares add up to 1.3: at most 1",
        ),
        ("prefix.groups", [{"share": 0.5}], "prefix.groups.0.length: required"),
        (
            "prompt_tokens.buckets",
            {"100": 0.5, "200": 0.2},
            "prompt_tokens.buckets: the shares add up to 0.7, not 1",
        ),
        (
            "prompt_tokens.buckets",
            {"abc": 1.0},
            "prompt_tokens.buckets: bucket edge 'abc' is not a number of tokens",
        ),
        (
            "output_tokens.buckets",
            {"-5": 1.0},
            "output_tokens.buckets: bucket edge '-5' must be a positive number",
        ),
        ("prompt_tokens.buckets", [1, 2], "prompt_tokens.buckets: write the buckets as a mapping"),
        (
            "prompt_tokens.count",
            0,
            "prompt_tokens.count: Input should be greater than or equal to 1",
        ),
        ("prompt_tokens.p50", 5, "prompt_tokens: p50 is 5 but the buckets give"),
        ("prompt_tokens.bounds", {"p99": ">"}, "prompt_tokens: bounds {'p99': '>'} do not match"),
    ],
)
def test_a_bad_file_is_refused_with_the_field_named(
    tmp_path: Path, field: str, value: object, message: str
) -> None:
    data = good()
    put(data, field, value)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ShapeError) as caught:
        shapes.load(path)
    assert isinstance(caught.value, UsageError)
    assert str(caught.value).startswith(f"{path}: "), str(caught.value)
    assert message in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.yaml", "version: [1\n", "not valid YAML"),
        ("bad.json", "{", "not valid JSON"),
        ("list.yaml", "- 1\n- 2\n", "holds list, not a shape"),
        ("empty.yaml", "", "holds nothing, not a shape"),
        ("shape.txt", "version: 1\n", "a shape file ends in .json, .yaml or .yml (not '.txt')"),
    ],
)
def test_an_unreadable_file_is_refused(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ShapeError, match=re.escape(message)):
        shapes.load(path)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ShapeError, match=r"missing\.yaml: cannot read: No such file"):
        shapes.load(tmp_path / "missing.yaml")


def test_frozen() -> None:
    shape = chat()
    with pytest.raises(ValueError, match="frozen"):
        shape.api = "chat"  # type: ignore[misc]
    for part, field, value in (
        (shape.prompt_tokens, "count", 1),
        (shape.prefix, "hit_rate", 0.9),
        (shape.arrivals, "request_rate", 9.0),
    ):
        with pytest.raises(ValueError, match="frozen"):
            setattr(part, field, value)


def guide_example() -> str:
    blocks = re.findall(r"^```yaml\n(.*?)^```$", GUIDE.read_text(), flags=re.M | re.S)
    (example,) = [b for b in blocks if b.startswith("version: 1\n")]
    return example


def test_the_guide_example_loads() -> None:
    shape = shapes.parse(guide_example(), kind="yaml", name="docs/workload.md")
    assert isinstance(shape, WorkloadShape)
    assert shape.source.startswith("metrics ")


def test_the_guide_documents_every_field() -> None:
    doc = GUIDE.read_text()
    models: list[type[Any]] = [
        WorkloadShape, Lengths, shapes.Prefix, shapes.PrefixGroup, shapes.Arrivals,
    ]  # fmt: skip
    for model in models:
        for name in model.model_fields:
            assert f"`{name}`" in doc, f"docs/workload.md does not document {model.__name__}.{name}"
