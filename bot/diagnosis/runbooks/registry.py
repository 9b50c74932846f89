"""The probe registry: which probes a runbook may name. State lives on the instance."""

from __future__ import annotations

import inspect
from collections.abc import Iterable

from bot.diagnosis.probes.types import Params, Probe
from bot.kernel import UsageError


class ProbeRegistry:
    """Probes by name; registering checks that each one has the Probe shape."""

    def __init__(self, probes: Iterable[Probe] = ()) -> None:
        self._probes: dict[str, Probe] = {}
        for probe in probes:
            self.register(probe)

    def register(self, probe: Probe) -> None:
        """Add a probe; refuse a duplicate name or a probe that lacks the Probe shape."""
        name = getattr(probe, "name", None)
        if not isinstance(name, str) or not name.isidentifier():
            raise UsageError(f"probe {probe!r} needs a `name` that is an identifier")
        if name in self._probes:
            raise UsageError(f"probe {name!r} is registered twice")
        model = getattr(probe, "params_model", None)
        if not (isinstance(model, type) and issubclass(model, Params)):
            raise UsageError(f"probe {name!r}: params_model must subclass probes.types.Params")
        run = getattr(probe, "run", None)
        if not inspect.iscoroutinefunction(run):
            raise UsageError(f"probe {name!r}: run must be `async def run(*, target, params, ctx)`")
        wanted = {"target", "params", "ctx"}
        parameters = inspect.signature(run).parameters
        if not wanted <= set(parameters):
            raise UsageError(f"probe {name!r}: run must take keyword arguments {sorted(wanted)}")
        self._probes[name] = probe

    def get(self, name: str) -> Probe:
        """The probe of this name; UsageError listing the known ones."""
        try:
            return self._probes[name]
        except KeyError:
            raise UsageError(f"unknown probe {name!r}; known: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        """Registered probe names, sorted."""
        return sorted(self._probes)
