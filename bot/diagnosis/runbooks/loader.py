"""Loads `runbooks/*.yaml` at startup and refuses a bad one there, never mid-incident.

Checks: YAML and schema; every probe is registered; its params fit its model; every finding
and hypothesis names a reading that a probe of the same runbook yields; every hypothesis names a
known cause (bot/adr/causes.py's, or one the file declares under ``causes:``); runbook names are
unique. Each problem names the file and, where the YAML says, the line (``path:12: field: why``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from bot.adr import causes as vocabulary
from bot.diagnosis.probes.types import Params
from bot.diagnosis.runbooks.models import PLACEHOLDER, Hypothesis, Runbook
from bot.diagnosis.runbooks.registry import ProbeRegistry
from bot.kernel import UsageError


@dataclass(frozen=True)
class LoadedRunbook:
    """A runbook with each step's parameters parsed into its probe's model."""

    runbook: Runbook
    params: tuple[Params, ...]
    path: Path | None = None

    @property
    def name(self) -> str:
        """The runbook's name."""
        return self.runbook.name


@dataclass(frozen=True)
class RunbookSet:
    """All loaded runbooks; the most specific match wins."""

    runbooks: Sequence[LoadedRunbook]

    def select(self, labels: Mapping[str, str]) -> LoadedRunbook | None:
        """The runbook for an alert: the matching one with the most label conditions."""
        fitting = [rb for rb in self.runbooks if rb.runbook.matches(labels)]
        return max(fitting, key=lambda rb: len(rb.runbook.match), default=None)

    def names(self) -> list[str]:
        """Runbook names."""
        return [rb.name for rb in self.runbooks]


def check(runbook: Runbook, registry: ProbeRegistry, *, where: str) -> LoadedRunbook:
    """Validate a runbook against the registry; UsageError naming file, step and why."""
    params: list[Params] = []
    readings: set[str] = set()
    for i, step in enumerate(runbook.probes):
        try:
            probe = registry.get(step.probe)
        except UsageError as exc:
            raise UsageError(f"{where}: probes[{i}]: {exc}") from None
        try:
            parsed = probe.params_model.model_validate(step.params)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise UsageError(
                f"{where}: probes[{i}] ({step.probe}): params.{field}: {first['msg']}"
            ) from None
        params.append(parsed)
        readings |= {f"{step.probe}.{name}" for name in probe.readings(parsed)}
    for i, rule in enumerate(runbook.findings):
        probe_name, reading, _, _ = rule.parts
        if f"{probe_name}.{reading}" not in readings:
            known = ", ".join(sorted(readings))
            raise UsageError(
                f"{where}: findings[{i}]: no probe of this runbook yields "
                f"{probe_name}.{reading} (known: {known})"
            )
    return LoadedRunbook(runbook=runbook, params=tuple(params))


def yielded(loaded: LoadedRunbook, registry: ProbeRegistry) -> set[str]:
    """Every reading (``probe.reading``) the runbook's probes yield."""
    return {
        f"{step.probe}.{name}"
        for step, params in zip(loaded.runbook.probes, loaded.params, strict=True)
        for name in registry.get(step.probe).readings(params)
    }


def hypothesis_problems(runbook: Runbook, readings: set[str]) -> list[tuple[tuple[Any, ...], str]]:
    """(YAML location, why and what to write) for each unknown or shadowed cause and each
    reading no probe of the runbook yields."""
    problems: list[tuple[tuple[Any, ...], str]] = []
    for i, cause in enumerate(runbook.causes):
        if cause.name in vocabulary.BUILTIN:
            problems.append(
                (("causes", i, "name"), f"{cause.name!r} is a built-in cause: drop it here")
            )
    known = vocabulary.known({c.name: vocabulary.Cause(c.name, c.title) for c in runbook.causes})
    for i, hypothesis in enumerate(runbook.hypotheses):
        if hypothesis.cause not in known:
            problems.append((
                ("hypotheses", i, "cause"),
                f"unknown cause {hypothesis.cause!r}; write one of {', '.join(known)}, or declare "
                "it under `causes:` with a name and a title",
            ))  # fmt: skip
        for place, name in _named_readings(hypothesis):
            if name not in readings:
                problems.append((("hypotheses", i, place), _unknown_reading(name, readings)))
    return problems


def _named_readings(hypothesis: Hypothesis) -> list[tuple[str, str]]:
    """(field, reading) for every reading a hypothesis names, by the field that names it."""
    named = [("supported_when", n) for n in hypothesis.supported.readings]
    if hypothesis.ruled_out is not None:
        named += [("ruled_out_when", n) for n in hypothesis.ruled_out.readings]
    for place in ("number", "evidence"):
        named += [(place, n) for n in PLACEHOLDER.findall(getattr(hypothesis, place))]
    return named


def _unknown_reading(name: str, readings: set[str]) -> str:
    """Why a reading is refused, and the one meant (or every one this runbook's probes yield)."""
    close = difflib.get_close_matches(name, readings, n=1)
    instead = (
        f"did you mean {close[0]}?" if close else f"write one of {', '.join(sorted(readings))}"
    )
    return f"no probe of this runbook yields {name}; {instead} (or add the probe that yields it)"


def inspect_file(path: Path, registry: ProbeRegistry) -> tuple[LoadedRunbook | None, list[str]]:
    """Load one runbook file and list every problem found (``path:line: field: why``)."""
    try:
        text = path.read_text(encoding="utf-8")
        data, root = yaml.safe_load(text), yaml.compose(text)
    except (OSError, UnicodeDecodeError) as exc:
        return None, [f"cannot read runbook {path}: {exc}"]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        return None, [f"{at}: not valid YAML: {exc}"]
    try:
        runbook = Runbook.model_validate(data)
    except ValidationError as exc:
        return None, [
            f"{_at(path, root, e['loc'])}: {_field(e['loc']) or 'file'}: "
            f"{e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        ]
    try:
        loaded = check(runbook, registry, where=str(path))
    except UsageError as exc:
        return None, [str(exc)]
    problems = [
        f"{_at(path, root, loc)}: {_field(loc)}: {why}"
        for loc, why in hypothesis_problems(runbook, yielded(loaded, registry))
    ]
    return LoadedRunbook(runbook=loaded.runbook, params=loaded.params, path=path), problems


def load_file(path: Path, registry: ProbeRegistry) -> LoadedRunbook:
    """Load and check one runbook file; UsageError listing its problems."""
    loaded, problems = inspect_file(path, registry)
    if problems or loaded is None:
        raise UsageError("\n".join(problems))
    return loaded


def _field(loc: Sequence[Any]) -> str:
    """('hypotheses', 0, 'cause') -> 'hypotheses[0].cause'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out.lstrip(".")


def _at(path: Path, root: yaml.Node | None, loc: Sequence[Any]) -> str:
    """``path:line`` of the deepest YAML node on ``loc`` (just ``path`` without one)."""
    node, line = root, None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            node = node.value[part] if part < len(node.value) else None
        else:
            node = None
        if node is None:
            break
        line = node.start_mark.line + 1
    return str(path) if line is None else f"{path}:{line}"


def load_dir(directory: Path, registry: ProbeRegistry) -> RunbookSet:
    """Load every `*.yaml`/`*.yml` file of a directory; refuse an empty one or a duplicate name."""
    if not directory.is_dir():
        raise UsageError(f"runbook directory {directory} does not exist")
    paths = sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])
    if not paths:
        raise UsageError(f"no runbooks (*.yaml) in {directory}")
    loaded: list[LoadedRunbook] = []
    for path in paths:
        runbook = load_file(path, registry)
        clash = next((rb for rb in loaded if rb.name == runbook.name), None)
        if clash is not None:
            raise UsageError(f"{path}: runbook name {runbook.name!r} is also used by {clash.path}")
        loaded.append(runbook)
    return RunbookSet(runbooks=tuple(loaded))
