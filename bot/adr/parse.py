"""Parses an ADR file (YAML front matter + the seed's Markdown template) into a record.

Every problem is reported with the file, the field (a front-matter path such as
``fix.engine_args.block-size``, or a body place such as ``matrix row 2``) and why.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from bot.adr.models import Adr, FrontMatter
from bot.adr.workload.describe import context_line, earlier_context_line
from bot.adr.workload.shape import VERSION as SHAPE_VERSION
from bot.adr.workload.shape import WorkloadShape
from bot.kernel import AdrError
from bot.kernel.numbers import Bound, Reading, catalogue

SECTIONS = (
    "## 1. 变更上下文 (Context)",
    "## 2. 实验对比数据 (Metrics Matrix)",
    "## 3. 固化的系统规则 (Solidified Rules)",
)
MATRIX_COLUMNS = ("配置参数", *(str(m.column) for m in catalogue.MATRIX), "结论")
# An ADR's front matter nests a few levels (workload.prefix.groups.0.share is 5): far past
# that, it is no ADR, and validating it would only exhaust the stack.
MAX_DEPTH = 32
_TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep: an ADR's fields nest a few levels at most"
_SEPARATOR = re.compile(r"^\|(\s*:?-{3,}:?\s*\|)+$")
_PIPE = re.compile(r"(?<!\\)\|")
_LATENCY = re.compile(r"^(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>ms|s)$")
_PERCENT = re.compile(r"^(?P<n>\d+(?:\.\d+)?)\s*%$")
# a cell: an optional bound sign, the number, an optional span "(low-high)" with its unit(s)
_CELL = re.compile(
    r"^(?P<sign>≤|<=|>)?\s*(?P<n>[^\s(]+)"
    r"(?:\s*\((?P<low>[\d.]+\s*(?:ms|s|%)?)\s*[-–]\s*(?P<high>[\d.]+\s*(?:ms|s|%))\))?$"
)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an ADR: where (file, field) and why."""

    file: str
    field: str
    why: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.why}"

    def error(self) -> AdrError:
        """This problem as the error the CLI prints."""
        return AdrError(self.why, file=self.file, field=self.field)


def load(path: Path) -> Adr:
    """Read and parse one ADR file; raise AdrError naming file, field and why."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AdrError(f"cannot read: {exc}", file=str(path)) from exc
    return parse(text, file=str(path))


def parse(text: str, *, file: str = "<adr>") -> Adr:
    """Parse ADR text; raise AdrError for the first problem."""
    adr, problems = parse_with_problems(text, file=file)
    if problems:
        raise problems[0].error()
    assert adr is not None
    return adr


def parse_with_problems(text: str, *, file: str = "<adr>") -> tuple[Adr | None, list[Problem]]:
    """Parse ADR text into a record (None if impossible) and every problem found on the way."""
    problems: list[Problem] = []
    front_text, body = _split(text)
    if front_text is None:
        return None, [
            Problem(
                file,
                "front matter",
                "the file must start with a '---' line, "
                "YAML front matter, and a closing '---' line",
            )
        ]
    try:
        data = yaml.safe_load(front_text)
    except RecursionError:
        return None, [Problem(file, "front matter", _TOO_DEEP)]
    except ValueError as exc:  # not a YAMLError: an integer past Python's 4,300 digits
        return None, [Problem(file, "front matter", f"not a value an ADR can hold: {exc}")]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 2}: " if mark is not None else ""
        return None, [
            Problem(file, "front matter", f"{where}not valid YAML: {getattr(exc, 'problem', exc)}")
        ]
    if not isinstance(data, dict):
        return None, [Problem(file, "front matter", "must be a YAML mapping (id: ..., title: ...)")]
    if _depth(data) > MAX_DEPTH:
        return None, [Problem(file, "front matter", _TOO_DEEP)]
    try:
        front = FrontMatter.model_validate(data)
    except ValidationError as exc:
        problems += [Problem(file, _loc(e["loc"]), _why(e)) for e in exc.errors()]
        front = None
    parts = _body(body, file, problems)
    if front is None:
        return None, problems
    if parts.pop("heading") != f"# {front.id}: {front.title}":
        problems.append(
            Problem(
                file,
                "heading",
                f"the first line of the body must be "
                f"'# {front.id}: {front.title}' (id and title from the front matter)",
            )
        )
    if front.workload is not None and "context" in parts:
        parts["context"] = without_context_line(str(parts["context"]), front.workload)
    try:
        return Adr.model_validate(front.model_dump(exclude_unset=True) | parts), problems
    except ValidationError as exc:
        problems += [Problem(file, _loc(e["loc"]), _why(e)) for e in exc.errors()]
        return None, problems


def _depth(data: object) -> int:
    """How deep mappings and lists nest in ``data`` (counted without recursion)."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        if isinstance(node, dict | list):
            children = node.values() if isinstance(node, dict) else node
            stack += [(child, depth + 1) for child in children]
    return deepest


def _split(text: str) -> tuple[str | None, str]:
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return None, text
    for i, line in enumerate(lines[1:], start=1):
        if line.strip() == "---":
            return "\n".join(lines[1:i]), "\n".join(lines[i + 1 :])
    return None, text


def without_context_line(context: str, shape: WorkloadShape) -> str:
    """The Context text without the line the template writes for the shape (it is rendered
    from ``workload:``, so it is not kept twice), in this ruleloop's words or an earlier one's;
    any other line stays as written."""
    lines = {context_line(shape), earlier_context_line(shape)}
    return "\n".join(text for text in context.splitlines() if text.strip() not in lines)


def _loc(loc: tuple[object, ...]) -> str:
    return ".".join(str(part) for part in loc) or "front matter"


def _why(error: ErrorDetails) -> str:
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        loc = tuple(error["loc"])
        if loc[:1] == ("workload",) and (model := _shape_model(loc[1:-1])) is not None:
            allowed = ", ".join(model.model_fields)
            return f"unknown field; allowed here: {allowed} (docs/workload.md)"
        return "unknown field (check the spelling; docs/writing-adrs.md lists the ADR fields)"
    if error["type"] == "missing":
        return "required field is missing"
    if tuple(error["loc"]) == ("workload", "version"):
        return f"version {error['input']!r}: this ruleloop reads shape version {SHAPE_VERSION}"
    if error["loc"][:1] == ("workload",) and error["type"].startswith(("timezone", "datetime")):
        return message + " (write e.g. 2026-09-01T12:00:00Z)"
    return message


def _shape_model(loc: tuple[object, ...]) -> type[BaseModel] | None:
    """The part of a workload shape that ``loc`` (below ``workload``) leads into."""
    model: type[BaseModel] = WorkloadShape
    for part in loc:
        if isinstance(part, int):  # a list index (prefix.groups.0)
            continue
        field = model.model_fields.get(str(part))
        inner = None if field is None else _model_of(field.annotation)
        if inner is None:
            return None
        model = inner
    return model


def _model_of(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in get_args(annotation) if (m := _model_of(a)) is not None), None)


def _body(body: str, file: str, problems: list[Problem]) -> dict[str, object]:
    lines = body.strip("\n").splitlines()
    heading = lines[0].strip() if lines else ""
    sections: list[tuple[str, list[str]]] = []
    for line in lines[1:]:
        if line.startswith("## "):
            sections.append((line.strip(), []))
        elif sections:
            sections[-1][1].append(line)
        elif line.strip():
            problems.append(Problem(file, "body", f"text before {SECTIONS[0]!r}: {line.strip()!r}"))
    found = [title for title, _ in sections[: len(SECTIONS)]]
    if found != list(SECTIONS):
        problems.append(
            Problem(
                file,
                "body",
                "the body needs the seed's sections, in order: "
                + "; ".join(SECTIONS)
                + f" (found: {'; '.join(found) or 'none'})",
            )
        )
        return {"heading": heading}
    (_, context), (_, matrix), (_, rules) = sections[:3]
    notes = "\n".join(f"{title}\n" + "\n".join(text) for title, text in sections[3:])
    rows, matrix_notes = _matrix(matrix, file, problems)
    return {
        "heading": heading,
        "context": "\n".join(context),
        "matrix": rows,
        "matrix_notes": matrix_notes,
        "rules": _rules(rules, file, problems),
        "notes": notes,
    }


def _cells(line: str) -> list[str]:
    inner = line.strip().removeprefix("|").removesuffix("|")
    return [cell.strip().replace("\\|", "|") for cell in _PIPE.split(inner)]


def _matrix(
    lines: list[str], file: str, problems: list[Problem]
) -> tuple[list[dict[str, object]], str]:
    table = [i for i, line in enumerate(lines) if line.lstrip().startswith("|")]
    if not table:
        problems.append(Problem(file, "matrix", "section 2 has no Metrics Matrix table"))
        return [], "\n".join(lines)
    start, end = table[0], table[-1] + 1
    if any(line.strip() for line in lines[:start]):
        problems.append(Problem(file, "matrix", "section 2 must start with the table"))
    if tuple(_cells(lines[start])) != MATRIX_COLUMNS:
        problems.append(
            Problem(
                file, "matrix", "the table header must be | " + " | ".join(MATRIX_COLUMNS) + " |"
            )
        )
        return [], ""
    if end - start < 2 or not _SEPARATOR.match(lines[start + 1].replace(" ", "")):
        problems.append(
            Problem(file, "matrix", "the header row must be followed by | :--- | ... |")
        )
        return [], ""
    rows: list[dict[str, object]] = []
    for n, line in enumerate(lines[start + 2 : end], start=1):
        cells = _cells(line)
        if len(cells) != len(MATRIX_COLUMNS):
            problems.append(
                Problem(
                    file, f"matrix row {n}", f"has {len(cells)} cells, needs {len(MATRIX_COLUMNS)}"
                )
            )
            continue
        config, *numbers, verdict = cells
        row: dict[str, object] = {"config": config, "verdict": verdict, "bounds": {}, "spans": {}}
        for cell, metric in zip(numbers, catalogue.MATRIX, strict=True):
            kind, key = ("ms" if metric.unit == "ms" else "%"), metric.key
            number = _number(cell, kind, f"matrix row {n}, {metric.column}", file, problems)
            row[key] = number.value if number else None
            if number and number.bound is not None:
                row["bounds"][key] = number.bound  # type: ignore[index]
            if number and number.span is not None:
                row["spans"][key] = number.span  # type: ignore[index]
        rows.append(row)
    return rows, "\n".join(lines[end:])


def _number(cell: str, kind: str, field: str, file: str, problems: list[Problem]) -> Reading | None:
    """A matrix cell: '350ms', '1.2s', '95%', a bound '≤10ms' / '>20000ms', an estimate
    '12% (0-24%)'; None for '-' (not measured)."""
    if cell in ("-", ""):
        return None
    m = _CELL.match(cell)
    texts = [] if m is None else [m["n"]]
    if m and m["high"]:
        high = m["high"].replace(" ", "")
        unit = high.lstrip("0123456789.")
        low = m["low"].replace(" ", "")
        texts += [low if low.endswith(("ms", "s", "%")) else low + unit, high]
    numbers = [n for text in texts if (n := _plain_number(text, kind)) is not None]
    if m and texts and len(numbers) == len(texts):
        bound = {"≤": Bound.AT_MOST, "<=": Bound.AT_MOST, ">": Bound.MORE_THAN}.get(m["sign"] or "")
        span = (numbers[1], numbers[2]) if len(numbers) == 3 else None
        return Reading(numbers[0], bound, span)
    example = "350ms" if kind == "ms" else "95%"
    problems.append(
        Problem(
            file,
            field,
            f"{cell!r} is not a value like {example} (a bound like ≤{example}, an estimate like "
            f"{example} (0-{example}), or '-' if not measured)",
        )
    )
    return None


def _plain_number(text: str, kind: str) -> float | None:
    """'350ms' / '1.2s' in milliseconds, '95%' as 0.95; None when it is not one."""
    if kind == "ms" and (m := _LATENCY.match(text)):
        return float(m["n"]) * (1000 if m["unit"] == "s" else 1)
    if kind == "%" and (m := _PERCENT.match(text)):
        return float(m["n"]) / 100
    return None


def _rules(lines: list[str], file: str, problems: list[Problem]) -> list[str]:
    rules: list[str] = []
    for line in lines:
        if line.startswith("- "):
            rules.append(line[2:])
        elif line.startswith("  ") and rules:
            rules[-1] += "\n" + line[2:]
        elif line.strip():
            problems.append(
                Problem(file, "rules", f"each rule is a '- ' list item; got {line.strip()!r}")
            )
    return rules


def date_of_id(adr_id: str) -> dt.date | None:
    """The date an ADR id carries (ADR-20260831-01 -> 2026-08-31), None if it has none."""
    m = re.match(r"^ADR-(\d{4})(\d{2})(\d{2})-\d+$", adr_id)
    if not m:
        return None
    try:
        return dt.date(int(m[1]), int(m[2]), int(m[3]))
    except ValueError:
        return None
