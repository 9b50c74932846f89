"""Where a change to a target stands: its kinds, its states, and the groups of states the flows
and the store ask about.

Every change to a target (a remediation, a tuning session, a drift before-run) is one row of
``changes`` (bot.kernel.store.models.Change). ``ChangeState`` and ``ChangeKind`` are ``StrEnum``s:
each
member is the very string stored in ``changes.state`` / ``changes.kind`` (and written in audit
details), so rows read back compare equal to the members.
"""

from __future__ import annotations

from enum import StrEnum


class ChangeKind(StrEnum):
    """What a change is: an /apply-adr remediation, a `ruleloop tune --target` session, or the
    drift job's before-run of an in-force ADR (stored as a tuning session of its own kind)."""

    REMEDIATION = "remediation"
    TUNING = "tuning"
    DRIFT_BEFORE_RUN = "drift_before_run"


class ChangeState(StrEnum):
    """One change's state.

    A remediation: pending -> approved -> applying -> canary -> promoting -> promoted, or
    rolling_back -> rolled_back, or it ends cancelled / expired / interrupted / failed / dry_run.
    A canary that could not decide, where the ADR asks for a human, leaves it held (canary ->
    held): a person keeps it (held -> canary -> promoting ...) or rolls it back (held ->
    rolling_back), and a hold nobody answers in time is rolled back.
    A tuning session (or a before-run): running -> restoring -> restored, or failed (the restore
    did not work: manual action)."""

    PENDING = "pending"
    APPROVED = "approved"
    APPLYING = "applying"
    CANARY = "canary"
    PROMOTING = "promoting"
    PROMOTED = "promoted"
    ROLLING_BACK = "rolling_back"
    HELD = "held"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    INTERRUPTED = "interrupted"
    DRY_RUN = "dry_run"
    RUNNING = "running"
    RESTORING = "restoring"
    RESTORED = "restored"


# A remediation in one of these states is in flight: pending or running.
IN_FLIGHT = (
    ChangeState.PENDING,
    ChangeState.APPROVED,
    ChangeState.APPLYING,
    ChangeState.CANARY,
    ChangeState.PROMOTING,
    ChangeState.ROLLING_BACK,
)
# approved and running: a replica works on these
ACTIVE = frozenset(IN_FLIGHT) - {ChangeState.PENDING}
# A tuning session (or before-run) in one of these states changes the target's flags.
TUNING = (ChangeState.RUNNING, ChangeState.RESTORING)
# A change in one of these states holds its target: no second change of any kind may be pending
# or running there (the partial unique index on changes, bot.kernel.store.models, is what two racing
# requests run into; migration 0016 wrote the same list). A held change runs nowhere (no
# heartbeat, so resume leaves it be) but its flags are on the canary stage: it holds the target.
HOLDS = (*IN_FLIGHT, ChangeState.HELD, *TUNING)
