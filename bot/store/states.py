"""Where a remediation stands: its states, and the groups of them the flow and the store ask about.

``RemediationState`` is a ``StrEnum``: each member is the very string stored in
``remediations.state`` (and written in audit details), so rows read back compare equal to the
members, and nothing stored changes.
"""

from __future__ import annotations

from enum import StrEnum


class RemediationState(StrEnum):
    """One remediation's state: pending -> approved -> applying -> canary -> promoting ->
    promoted, or rolling_back -> rolled_back, or it ends cancelled / expired / interrupted /
    failed / dry_run."""

    PENDING = "pending"
    APPROVED = "approved"
    APPLYING = "applying"
    CANARY = "canary"
    PROMOTING = "promoting"
    PROMOTED = "promoted"
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    INTERRUPTED = "interrupted"
    DRY_RUN = "dry_run"


# A remediation in one of these states holds its target: no second one may be pending or
# running there (the partial unique index on remediations, bot.store.models, is what two racing
# requests run into; migration 0003 wrote the same list).
IN_FLIGHT = (
    RemediationState.PENDING,
    RemediationState.APPROVED,
    RemediationState.APPLYING,
    RemediationState.CANARY,
    RemediationState.PROMOTING,
    RemediationState.ROLLING_BACK,
)
# approved and running: a replica works on these
ACTIVE = frozenset(IN_FLIGHT) - {RemediationState.PENDING}
