"""Loads `runbooks/*.yaml` at startup and refuses a bad one there, never mid-incident.

Checks: YAML and schema; every probe is registered; its params fit its model; every finding
names a reading that a probe of the same runbook yields; runbook names are unique.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from bot.errors import UsageError
from bot.probes.types import Params
from bot.runbooks.models import Runbook
from bot.runbooks.registry import ProbeRegistry


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


def load_file(path: Path, registry: ProbeRegistry) -> LoadedRunbook:
    """Load and check one runbook file."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read runbook {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML: {exc}") from None
    try:
        runbook = Runbook.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "file"
        raise UsageError(f"{path}: {field}: {first['msg']}") from None
    loaded = check(runbook, registry, where=str(path))
    return LoadedRunbook(runbook=loaded.runbook, params=loaded.params, path=path)


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
