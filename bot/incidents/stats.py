"""`ruleloop adr stats`: per ADR, what the store says happened to it.

matched: incidents whose diagnosis offered it. applied: its changes that ran (reached applying
or later; a dry run, a refused or an expired request is not applied). kept: promoted. rolled
back: rolled back. recurred: kept changes after which the same cause (the diagnosis's supported
cause then, else the ADR's ``cause:``) was supported again on the target within ``days``, or the
ADR was offered there again. confirmed / marked wrong: on-call's answers to the cause buttons
in threads that offered it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from bot.kernel.store import CauseFeedback, Incident, Remediation
from bot.kernel.store import ChangeState as S

NOT_APPLIED = (S.PENDING, S.APPROVED, S.CANCELLED, S.EXPIRED, S.DRY_RUN)
COLUMNS = (
    ("matched", "matched"),
    ("applied", "applied"),
    ("kept", "kept"),
    ("rolled_back", "rolled back"),
    ("recurred", "recurred"),
    ("confirmed", "cause ok"),
    ("marked_wrong", "cause wrong"),
)


@dataclass
class AdrStats:
    """One ADR's counts."""

    adr_id: str
    matched: int = 0
    applied: int = 0
    kept: int = 0
    rolled_back: int = 0
    recurred: int = 0
    confirmed: int = 0
    marked_wrong: int = 0


def collect(
    s: Session, *, days: int, causes_of: Mapping[str, Sequence[str]] | None = None
) -> list[AdrStats]:
    """Every ADR the store has a trace of (``causes_of``: each ADR's ``cause:``, for recurrence
    when a change's incident supported none), sorted by id."""
    stats: dict[str, AdrStats] = {}

    def of(adr_id: str) -> AdrStats:
        return stats.setdefault(adr_id, AdrStats(adr_id))

    incidents = {i.id: i for i in s.scalars(select(Incident).order_by(Incident.opened_at))}
    for incident in incidents.values():
        for adr_id in incident.summary.matches:
            of(str(adr_id)).matched += 1
    for change in s.scalars(select(Remediation).order_by(Remediation.id)):
        row = of(change.adr_id)
        row.applied += change.state not in NOT_APPLIED
        row.kept += change.state == S.PROMOTED
        row.rolled_back += change.state == S.ROLLED_BACK
        if change.state == S.PROMOTED:
            wanted = _causes(incidents.get(change.incident_id), (causes_of or {}).get(row.adr_id))
            after = change.updated_at
            row.recurred += _recurred(incidents.values(), change, wanted, after, days)
    for answer in s.scalars(select(CauseFeedback)):
        for adr_id in answer.adr_ids or []:
            row = of(str(adr_id))
            row.confirmed += answer.verdict == "confirmed"
            row.marked_wrong += answer.verdict == "wrong"
    return sorted(stats.values(), key=lambda row: row.adr_id)


def _causes(incident: Incident | None, declared: Sequence[str] | None) -> set[str]:
    supported = incident.summary.supported() if incident is not None else []
    return set(supported or declared or ())


def _recurred(
    incidents: Iterable[Incident],
    change: Remediation,
    causes: set[str],
    after: dt.datetime,
    days: int,
) -> bool:
    """Another incident on the change's target within ``days`` after it, of the same cause or
    offered the same ADR."""
    until = after + dt.timedelta(days=days)
    for incident in incidents:
        if incident.id == change.incident_id or incident.target != change.target:
            continue
        if not after < incident.opened_at <= until:
            continue
        summary = incident.summary
        if causes & set(summary.supported()) or change.adr_id in summary.matches:
            return True
    return False


def table(rows: Sequence[AdrStats], *, days: int) -> str:
    """A terminal table: one line per ADR, the counts right-aligned under short headers."""
    if not rows:
        return "no ADR was matched, applied or judged in this store yet"
    width = max(len("ADR"), *(len(r.adr_id) for r in rows))
    labels = [label if key != "recurred" else f"recurred {days}d" for key, label in COLUMNS]
    head = "ADR".ljust(width) + "".join(f"  {label:>{len(label)}}" for label in labels)
    lines = [head, "-" * len(head)]
    for row in rows:
        keys = (key for key, _ in COLUMNS)
        pairs = zip(keys, labels, strict=True)
        cells = (f"  {getattr(row, key):>{len(label)}}" for key, label in pairs)
        lines.append(row.adr_id.ljust(width) + "".join(cells))
    return "\n".join(lines)


def as_json(rows: Sequence[AdrStats], *, days: int) -> dict[str, object]:
    """The same counts as JSON."""
    return {"recurred_within_days": days, "adrs": [asdict(row) for row in rows]}
