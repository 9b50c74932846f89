"""Memory of earlier incidents: has this cause happened on this target before, and what then?

When a diagnosis supports a cause that an earlier incident on the same target supported too,
the thread says so: how many times in ``days``, which ADR was applied then and whether it was
kept, and how the workload moved since (the drift job's lines, ``workload.drift`` in the audit
log). A cause that on-call marked wrong there (the thread's "Wrong cause" button) is said to be
so. Read from the store only: the incidents' diagnosis summaries, the remediations, the audit
log and ``cause_feedback``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from bot.kernel.chat import escape
from bot.kernel.store import AuditEntry, CauseFeedback, DiagnosisSummary, Incident, Remediation
from bot.kernel.store import ChangeState as S

RECENT_DAYS = 7  # "3rd time in 7 days"
LOOKBACK_DAYS = 90  # how far back an earlier fix (and its story) is looked for
MAX_EARLIER = 500  # the latest incidents read of a target (a flapping alert makes many)
OUTCOME = {
    S.PROMOTED: "applied and kept",
    S.ROLLED_BACK: "applied and rolled back",
    S.FAILED: "tried and failed",
    S.INTERRUPTED: "tried (interrupted)",
}
DRIFT_ACTIONS = ("workload.drift", "workload.drifting")


@dataclass(frozen=True)
class Earlier:
    """An earlier incident of the same cause on the target, and the change made then."""

    incident_id: int
    opened_at: dt.datetime
    adr_id: str | None = None
    outcome: str | None = None  # OUTCOME's words; None: no change was made


@dataclass(frozen=True)
class Memory:
    """What the store remembers of one supported cause on one target."""

    cause: str
    times: int  # this incident and the earlier ones within ``days``
    days: int
    last: Earlier | None  # the latest earlier one with a change made, else the latest one
    moved: list[str] = field(default_factory=list)  # the drift lines since the change
    marked_wrong: dt.datetime | None = None  # the last time on-call said it was not the cause


def recall(
    s: Session, incident: Incident, summary: DiagnosisSummary, *, days: int = RECENT_DAYS
) -> list[Memory]:
    """What the store remembers of each cause this diagnosis supports on its target."""
    if not incident.target:
        return []
    causes = summary.supported()
    if not causes:
        return []
    since = incident.opened_at - dt.timedelta(days=LOOKBACK_DAYS)
    earlier = s.execute(  # the columns read only: 500 rows of every JSON column cost ~0.1 s
        select(Incident.id, Incident.opened_at, Incident.summary)
        .where(Incident.target == incident.target, Incident.id != incident.id,
               Incident.opened_at >= since, Incident.opened_at <= incident.opened_at)
        .order_by(Incident.opened_at.desc(), Incident.id.desc())
        .limit(MAX_EARLIER)
    ).all()  # fmt: skip
    supported = {i.id: set(i.summary.supported()) for i in earlier}  # read once
    out = []
    for cause in causes:
        same = [i for i in earlier if cause in supported[i.id]]
        wrong = _marked_wrong(s, incident.target, cause, before=incident.opened_at)
        if not same and wrong is None:
            continue
        recent = [i for i in same if i.opened_at >= incident.opened_at - dt.timedelta(days=days)]
        last = _last(s, same)
        moved = _moved(s, incident.target, last) if last is not None else []
        out.append(Memory(cause, len(recent) + 1, days, last, moved, wrong))
    return out


def _last(s: Session, same: Sequence[Any]) -> Earlier | None:
    """The latest earlier incident whose change ended (kept, rolled back...), else the latest."""
    if not same:
        return None
    changes = s.execute(
        select(Remediation.incident_id, Remediation.adr_id, Remediation.state)
        .where(
            Remediation.incident_id.in_([i.id for i in same]), Remediation.state.in_(list(OUTCOME))
        )
        .order_by(Remediation.id.desc())
    ).all()  # one query, not one per incident: up to MAX_EARLIER of them
    latest_change: dict[int, Any] = {}
    for row in changes:
        latest_change.setdefault(row.incident_id, row)
    for incident in same:
        if (change := latest_change.get(incident.id)) is not None:
            return Earlier(incident.id, incident.opened_at, change.adr_id, OUTCOME[S(change.state)])
    return Earlier(same[0].id, same[0].opened_at)


def _moved(s: Session, target: str, last: Earlier) -> list[str]:
    """The drift job's drifted dimensions of the ADR applied then, at its latest check since."""
    if last.adr_id is None:
        return []
    entries = s.scalars(
        select(AuditEntry)
        .join(Incident, AuditEntry.incident_id == Incident.id)
        .where(Incident.target == target, AuditEntry.action.in_(DRIFT_ACTIONS),
               AuditEntry.at >= last.opened_at)
        .order_by(AuditEntry.id.desc())
    )  # fmt: skip
    for entry in entries:
        lines = (entry.detail.get("dimensions") or {}).get(last.adr_id)
        if lines:
            return [str(line) for line in lines]
    return []


def _marked_wrong(
    s: Session, target: str, cause: str, *, before: dt.datetime
) -> dt.datetime | None:
    row = s.scalars(
        select(CauseFeedback)
        .where(CauseFeedback.target == target, CauseFeedback.cause == cause,
               CauseFeedback.verdict == "wrong", CauseFeedback.at <= before)
        .order_by(CauseFeedback.at.desc())
    ).first()  # fmt: skip
    return None if row is None else row.at


def day(at: dt.datetime) -> str:
    """'29 Nov': a date as a phone shows it."""
    return f"{at.day} {at:%b}"


def ordinal(n: int) -> str:
    """'1st', '2nd', '3rd', '11th'."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def memory_line(memory: Memory) -> str:
    """One line: '3rd time in 7 days: prefill_decode_mixing; on 29 Nov (incident #12)
    ADR-X was applied and kept; since then the workload moved: prompt p50 ...'."""
    last = memory.last
    cause = f"*{escape(memory.cause)}*"
    parts = [f"{ordinal(memory.times)} time in {memory.days} days: {cause}" if last else cause]
    if last is not None and last.adr_id is not None:
        parts.append(f"on {day(last.opened_at)} (incident #{last.incident_id}) "
                     f"{escape(last.adr_id)} was {last.outcome}")  # fmt: skip
    elif last is not None:
        parts.append(f"last seen on {day(last.opened_at)} (incident #{last.incident_id}), "
                     "no change made then")  # fmt: skip
    if memory.moved:
        parts.append("since then the workload moved: " + "; ".join(map(escape, memory.moved)))
    if memory.marked_wrong is not None:
        parts.append(f"on-call marked this cause wrong on {day(memory.marked_wrong)}")
    return "; ".join(parts)


def memory_text(memories: Sequence[Memory]) -> str | None:
    """The thread's message of what the store remembers (None: nothing to say)."""
    if not memories:
        return None
    return "\n".join(f":repeat: {memory_line(m)}" for m in memories)
