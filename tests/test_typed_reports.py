"""Reports cross the bot's packages as models, not dicts: the canary report is
``bot.canary.schema.CanaryReport`` and an incident's diagnosis summary is
``bot.kernel.store.summary.DiagnosisSummary``, both typed to the leaves; numbers travel as
``Reading`` (one map of them, ``Measured``, never a value map with a bounds map and a spans map
beside it). These ratchets fail when code goes back to reading a report by key, or when the
untyped ``dict[str, Any]`` counts grow past today's figures (197 in bot/ before issue 40; lower
them when you type another one)."""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from pathlib import Path

from pydantic import BaseModel

from bot.canary import CanaryReport
from bot.diagnosis import Diagnosis
from bot.diagnosis.probes.types import ProbeResult
from bot.diagnosis.runbooks.runner import RunbookResult
from bot.kernel.numbers import Measured
from bot.kernel.store.summary import CauseEntry, DiagnosisSummary

BOT = Path(__file__).resolve().parent.parent / "bot"
UNTYPED_CEILING = 175  # `dict[str, Any]` written in bot/ (197 before issue 40)
# The face names whose signature, fields or public methods hold a ``dict[str, Any]``: the store's
# JSON columns, Slack's wire blocks, the GPU agent's snapshot, the gateway's limits file.
FACE_CEILING = 56
# JSON records the reports keep for people, which no code reads numbers from: the parameters a
# canary run sent (its workload's, as given) and the chart's points (``ChartData.from_json``
# parses them where the page draws them).
RECORDS = {"CanaryReport.workload", "BackgroundClass.workload", "DiagnosisSummary.chart"}
ANY_MAP = re.compile(r"\b(?:dict|Mapping|MutableMapping)\[str, Any\]")
# a map of numbers' bounds or spans of its own, beside the numbers (the six types of issue 40)
SIDE_BY_SIDE = re.compile(r"\b(?:\w+_)?(?:bounds|spans): (?:Bounds|Spans|dict\[str, Bound\])")
# where the three maps are the stored form: ``Measured.of`` reads them into readings, and an ADR's
# workload (``Lengths``) keeps its quantiles as its front matter writes them (``.reading()``)
STORED_FORM = {"kernel/numbers/reading.py", "adr/workload/shape.py"}
SUMMARY_BY_KEY = re.compile(r"\bsummary(?:\.get\(|\[\s*[\"'])")
CANARY_BY_KEY = re.compile(
    r"\b(?:report|kept|judged|result\.report)(?:\.get\(|\[)\s*[\"']"
    r"(?:ttft_ms|tpot_ms|itl_ms|e2e_ms|gates|passed|goodput_ratio|kv_fragmentation|requests|"
    r"tokens|workload_shape|background)[\"']"
)


def _sources() -> dict[str, str]:
    return {str(p.relative_to(BOT.parent)): p.read_text() for p in sorted(BOT.rglob("*.py"))}


def _hits(pattern: re.Pattern[str], sources: dict[str, str]) -> list[str]:
    return [
        f"{path}:{n}: {line.strip()}"
        for path, text in sources.items()
        for n, line in enumerate(text.splitlines(), 1)
        if pattern.search(line)
    ]


def test_untyped_dicts_do_not_grow() -> None:
    count = sum(text.count("dict[str, Any]") for text in _sources().values())
    assert count <= UNTYPED_CEILING, (
        f"{count} `dict[str, Any]` in bot/ (ceiling {UNTYPED_CEILING}): give the new data a "
        "model (pydantic or a dataclass) instead"
    )


def test_no_module_reads_a_diagnosis_summary_by_key() -> None:
    sources = {p: t for p, t in _sources().items() if p != "bot/kernel/store/summary.py"}
    assert _hits(SUMMARY_BY_KEY, sources) == []


def test_no_module_reads_a_canary_report_by_key() -> None:
    # the ADR matcher reads a match condition's number from any JSON report by its dotted path
    # (`ruleloop adr match --report`), a canary's or the diagnosis's: by key, on purpose
    skip = ("bot/canary/schema.py", "bot/adr/metrics.py")
    sources = {p: t for p, t in _sources().items() if p not in skip}
    assert _hits(CANARY_BY_KEY, sources) == []


def test_the_ratchets_catch_a_read_by_key() -> None:
    """The judges above, on the lines they exist to refuse."""
    bad = {
        "x.py": 'rows = summary.get("headline") or {}\n'
        'ok = kept["passed"]\n'
        'p99 = report.get("ttft_ms")\n'
    }
    assert len(_hits(SUMMARY_BY_KEY, bad)) == 1
    assert len(_hits(CANARY_BY_KEY, bad)) == 2


def test_a_stored_summary_of_another_shape_keeps_what_it_can() -> None:
    """One part an earlier release wrote in another shape is dropped, never the whole summary
    (the thread and the page still show the numbers); a cause entry naming no cause is
    dropped alone."""
    stored = {
        "headline": {"ttft_p99_ms": 2400.0, "tpot_p99_ms": None},
        "baseline": {"ttft_p99_ms": "350 ms"},  # not [limit, ADR]
        "matches": ["ADR-20260831-01"],
        "causes": [{"cause": "queueing", "verdict": "supported"}, {"verdict": "x"}, "junk"],
        "from_a_newer_release": {"kept": True},
    }
    summary = DiagnosisSummary.of(stored)
    assert summary.diagnosed and summary.headline == stored["headline"]
    assert summary.baseline == {} and summary.matches == ["ADR-20260831-01"]
    assert summary.causes == [CauseEntry(cause="queueing", verdict="supported")]
    assert summary.supported() == ["queueing"]
    assert summary.json_dict()["from_a_newer_release"] == {"kept": True}
    assert DiagnosisSummary.of(None) == DiagnosisSummary() and not DiagnosisSummary().diagnosed


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> None:
    """Every pydantic model a model's fields reach."""
    if model in seen:
        return
    seen.add(model)
    for field in model.model_fields.values():
        for part in _parts(field.annotation):
            if isinstance(part, type) and issubclass(part, BaseModel):
                _models(part, seen)


def _parts(annotation: object) -> list[object]:
    """An annotation and every type inside it (``dict[str, list[X]] | None`` -> ... X ...)."""
    out = [annotation]
    for arg in typing.get_args(annotation):
        out += _parts(arg)
    return out


def _untyped(model: type[BaseModel]) -> set[str]:
    """The fields of ``model`` and the models it reaches whose type holds ``Any``."""
    seen: set[type[BaseModel]] = set()
    _models(model, seen)
    return {
        f"{m.__name__}.{name}"
        for m in seen
        for name, field in m.model_fields.items()
        if any(part is typing.Any for part in _parts(field.annotation))
    }


def test_the_canary_report_and_the_diagnosis_summary_are_typed_to_the_leaves() -> None:
    untyped = _untyped(CanaryReport) | _untyped(DiagnosisSummary)
    assert untyped <= RECORDS, f"typed reports hold untyped parts: {sorted(untyped - RECORDS)}"
    assert untyped >= RECORDS, f"typed since: take them off RECORDS: {sorted(RECORDS - untyped)}"


def test_the_untyped_check_sees_an_untyped_field() -> None:
    class Leaf(BaseModel):
        raw: dict[str, typing.Any] | None = None

    class Root(BaseModel):
        leaves: list[Leaf] = []

    assert _untyped(Root) == {"Leaf.raw"}


def test_numbers_travel_as_one_map_of_readings() -> None:
    for kind in (Measured, ProbeResult, RunbookResult, Diagnosis):
        types = {f.name: str(f.type) for f in dataclasses.fields(kind)}
        beside = {n for n in types if n.endswith(("bounds", "spans"))}
        assert not beside, f"{kind.__name__} keeps {sorted(beside)} beside its numbers"
        numbers = {n: t for n, t in types.items() if n in ("readings", "headline", "normal")}
        assert numbers, kind
        readings = "Measured" if kind is not Measured else "Mapping[str, Reading | None]"
        assert set(numbers.values()) == {readings}, (kind.__name__, numbers)
    found = [
        f"{path.relative_to(BOT)}: {line.strip()}"
        for path in BOT.rglob("*.py")
        if str(path.relative_to(BOT)) not in STORED_FORM
        for line in path.read_text().splitlines()
        if SIDE_BY_SIDE.search(line)
    ]
    assert found == [], "numbers beside a bounds or spans map of their own:\n" + "\n".join(found)


def _faces() -> set[str]:
    """Every name a package's face lists in its ``__all__``."""
    names: set[str] = set()
    for init in BOT.rglob("__init__.py"):
        for node in ast.walk(ast.parse(init.read_text())):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                names |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return names


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return ast.unparse(node.args) + " -> " + (ast.unparse(node.returns) if node.returns else "")


def _crossing(tree: ast.Module, public: set[str]) -> list[str]:
    """The face names of one module whose signature, fields or public methods hold an
    untyped ``dict[str, Any]``."""
    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in public:
            out += [node.name] if ANY_MAP.search(_signature(node)) else []
        if not isinstance(node, ast.ClassDef) or node.name not in public:
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and ANY_MAP.search(ast.unparse(item.annotation)):
                out.append(f"{node.name}.{ast.unparse(item.target)}")
            elif (
                isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                and not item.name.startswith("_")
                and ANY_MAP.search(_signature(item))
            ):
                out.append(f"{node.name}.{item.name}")
    return out


def test_untyped_dicts_crossing_a_face_only_go_down() -> None:
    public = _faces()
    crossing = [
        f"{path.relative_to(BOT)}: {name}"
        for path in sorted(BOT.rglob("*.py"))
        for name in _crossing(ast.parse(path.read_text()), public)
    ]
    assert len(crossing) <= FACE_CEILING, "more dict[str, Any] cross a face:\n" + "\n".join(
        crossing
    )


def test_the_face_count_sees_a_new_crossing() -> None:
    tree = ast.parse(
        "def shown(report: dict[str, Any]) -> str: ...\n"
        "def _hidden(report: dict[str, Any]) -> str: ...\n"
        "class Card:\n    body: Mapping[str, Any]\n    def text(self) -> dict[str, int]: ...\n"
    )
    assert _crossing(tree, {"shown", "_hidden", "Card"}) == ["shown", "_hidden", "Card.body"]
    assert _crossing(tree, {"Card"}) == ["Card.body"]
