"""What an actuator that records changes where people review them is told about one change.

The git actuator writes a commit and a pull request: they should say which ADR, on which
target, who asked and who approved, where the incident's thread is, and what the before-run
measured, so a reviewer reading the repository's history at 2 a.m. needs nothing else. The
service builds one ``ChangeContext`` from the remediation's record and hands it to actuators
that take one (``TakesContext``); others are not asked.
"""

from __future__ import annotations

from collections.abc import Mapping

from bot.change.actuators import Actuator, ChangeContext, Deployed, TakesContext
from bot.kernel.numbers import catalogue, show
from bot.kernel.store import Remediation


def give_context(
    actuator: Actuator,
    rem: Remediation,
    *,
    before: Deployed,
    adr_title: str = "",
    link: str | None = None,
    numbers: Mapping[str, float | None] | None = None,
    reason: str = "",
) -> None:
    """Tell ``actuator`` what this change is, if it takes a context."""
    if not isinstance(actuator, TakesContext):
        return
    lines = [f"ruleloop applies **{rem.adr_id}**{f' ({adr_title})' if adr_title else ''} "
             f"on target `{rem.target}`, remediation #{rem.id}."]  # fmt: skip
    approvers = ", ".join(rem.approved_by) or "nobody yet"
    lines.append(f"Requested by {rem.requested_by} in Slack, approved by {approvers}.")
    if link:
        lines.append(f"Incident thread: {link}")
    if rem.incident_id is not None:
        lines.append(f"Incident #{rem.incident_id}.")
    measured = [
        f"- {_label(key)}: {show(key, value)}"
        for key, value in (numbers or {}).items()
        if value is not None
    ]
    if measured:
        lines.append("Before the change, the canary measured:\n" + "\n".join(measured))
    actuator.prepare(
        ChangeContext(
            change_id=f"remediation-{rem.id}",
            title=f"{rem.adr_id} on {rem.target}",
            description="\n\n".join(lines),
            before=before,
            reason=reason,
        )
    )


def _label(key: str) -> str:
    """The catalogue's name for a number ('TTFT p99'), or its key for one it does not hold."""
    metric = catalogue.BY_KEY.get(key)
    return metric.label if metric else key
