"""The ADRs in force on a target: what the baseline canary and the workload-drift job check, and
the standing gates a change on the target is watched against (its guardrails).

The ADRs *in force* on a target are the ADR of the newest remediation promoted on it (what it
runs now); while none was promoted there, the ADRs its ``[scheduler.targets.X] adrs`` lists.
Only accepted ADRs count.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from bot.adr import Adr, AdrStore, Normal
from bot.change.actuators.base import Deployed
from bot.kernel.store import Database, Remediation
from bot.kernel.store import service as store

log = logging.getLogger("ruleloop.scheduler")


@dataclass(frozen=True)
class InForce:
    """The accepted ADRs in force, the ids that name no accepted ADR, and, of the change that
    put them in force (None: no such change), its before-run numbers and what served before it
    (the actuator's record: the flags its ADR replaced)."""

    adrs: list[Adr]
    missing: list[str]
    before: Normal | None
    replaced: Deployed | None = None

    @property
    def ids(self) -> list[str]:
        """The in-force ADRs' ids."""
        return [adr.id for adr in self.adrs]


def adrs_in_force(db: Database, adrs: AdrStore, *, target: str, listed: Sequence[str]) -> InForce:
    """What is in force on ``target`` now (reads the store: call it off the event loop)."""
    with db.transaction() as s:
        promoted = store.promoted_change(s, target=target)
    return in_force_of(promoted, adrs, target=target, listed=listed)


def in_force_of(
    promoted: Remediation | None, adrs: AdrStore, *, target: str, listed: Sequence[str]
) -> InForce:
    """What is in force on ``target`` given its newest promoted change (``promoted``, read by
    the caller in a transaction of its own: None when none was promoted there)."""
    before = None if promoted is None else promoted.result.get("before_numbers") or None
    replaced = Deployed.from_json(promoted.before) if promoted and promoted.before else None
    ids = [promoted.adr_id] if promoted else list(listed)
    found, missing = [], []
    for adr_id in ids:
        entry = adrs.find(adr_id)
        if entry is not None and entry[1].status == "accepted":
            found.append(entry[1])
        else:
            missing.append(adr_id)
    if missing:
        log.warning("%s: not accepted ADRs, left out of the scheduled checks: %s", target, missing)
    return InForce(found, missing, before, replaced)
