"""The one interface every actuator implements, and what it reports back.

An actuator changes the tunable vLLM flags of one target and can put them back:

    current()          what serves now (flags, URL the canary should load, opaque details)
    apply(flags)       set these tunable flags (the merged set, not a delta) on the canary stage
                       (the whole target when there is no separate canary), wait until healthy
    promote(flags)     roll the same flags out to the rest of the target (no-op without a stage)
    rollback(before)   restore exactly what ``before`` recorded, wait until healthy again
    stage(recorded)    serve exactly the command line ``recorded`` kept of the target, on the
                       canary stage only (the whole target when there is none), as ``rollback``
                       restores it: the tunable flags it did not run are removed; wait

All methods are async and raise ``ActuatorError`` with a message fit for Slack when the change
cannot be made or the engine does not come back healthy.

An actuator that records why a change is made where people review it (the git actuator: a
commit and a pull request) also implements ``TakesContext``; the remediation service then
calls ``prepare`` with a ``ChangeContext`` before ``apply`` and before ``rollback``. It is
optional: actuators without it are called exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from bot.change.argv import FlagValues
from bot.kernel import RuleloopError


class ActuatorError(RuleloopError):
    """A change could not be applied, or the engine did not become healthy after it."""


@dataclass(frozen=True)
class Deployed:
    """What serves on a target: its tunable flags, where to send canary load, and the details
    the actuator needs to restore it exactly (argv, generation, ...; JSON-serialisable)."""

    flags: FlagValues
    base_url: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Plain data for the store and the audit log."""
        return {"flags": dict(self.flags), "base_url": self.base_url, "detail": dict(self.detail)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Deployed:
        """The inverse of ``to_json``."""
        return cls(
            flags=dict(data["flags"]), base_url=str(data["base_url"]), detail=dict(data["detail"])
        )


class Actuator(Protocol):
    """Changes one target's vLLM flags; see the module docstring for the contract."""

    kind: str
    # a capability, not a kind to compare with: False for one that changes nothing (dry run),
    # so a before-run, a tuning trial or a canary there would measure what serves now
    changes_flags: bool

    async def current(self) -> Deployed:
        """What serves now."""
        ...

    async def apply(self, flags: FlagValues) -> Deployed:
        """Serve with these tunable flags (on the canary stage); wait until healthy."""
        ...

    async def promote(self, flags: FlagValues) -> Deployed:
        """Roll the applied flags out beyond the canary stage (no-op when there is none)."""
        ...

    async def rollback(self, before: Deployed) -> Deployed:
        """Restore ``before`` exactly; wait until healthy."""
        ...

    async def stage(self, recorded: Deployed) -> Deployed:
        """Serve exactly ``recorded``'s tunable flags (none added) on the canary stage; wait."""
        ...

    async def aclose(self) -> None:
        """Let go of what the actuator holds (an API client); called once per change."""
        ...


@dataclass(frozen=True)
class ChangeContext:
    """Why a change is made: what the commit and the pull request of a git change say."""

    change_id: str  # the same on every replica and after a restart: "remediation-42"
    title: str  # "ADR-20260831-01 on prod-a"
    description: str = ""  # Markdown: the incident's link, approvers, the before-run's numbers
    before: Deployed | None = None  # what current() read when the change was requested
    reason: str = ""  # why it is rolled back (set before rollback)


@runtime_checkable
class TakesContext(Protocol):
    """An actuator that records a ChangeContext with the change (optional)."""

    def prepare(self, context: ChangeContext) -> None:
        """Use ``context`` for the next apply, promote or rollback."""
        ...
