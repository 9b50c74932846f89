"""The one card a change shows in the incident's thread: its view, updated at every step.

A step is a conditional state move (audited in the same transaction) and then the card again;
a run that no longer owns the change gets ``LostRun`` and has changed nothing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from bot.adr.models import Adr, AdrGates
from bot.adr.shared import SharedAdrStore
from bot.canary.limits import judged_limits
from bot.change.argv import diff
from bot.change.liveness import LostRun
from bot.chat.messages import MessageRef
from bot.config import Settings
from bot.errors import RuleloopError
from bot.remediation.ports import RemediationNotifier, RemediationView
from bot.remediation.records import SUBJECT, RemediationRecords
from bot.runtime.redact import redact
from bot.store import buttons
from bot.store.models import Remediation
from bot.store.states import RemediationState

log = logging.getLogger("ruleloop.remediation")


class Card:
    """Moves a change from state to state and shows where it stands on its card."""

    def __init__(
        self,
        *,
        settings: Settings,
        records: RemediationRecords,
        adrs: SharedAdrStore,
        notifier: RemediationNotifier,
    ) -> None:
        self._settings = settings
        self._records = records
        self._adrs = adrs
        self._notifier = notifier

    async def step(
        self,
        remediation_id: int,
        state: RemediationState,
        action: str,
        detail: dict[str, Any],
        *,
        note: str,
        owner: str,
        expect: list[RemediationState],
        adr: Adr | None = None,
        **fields: Any,
    ) -> None:
        """Move to ``state`` from one of ``expect`` as run ``owner`` (audited, then shown on
        the card); LostRun, having changed nothing, when the change is not that any more.
        ``fields`` are the record's columns the step sets too (its result, what serves);
        ``adr``: the change's ADR as its run read it (else the card reads it)."""
        moved = await self._records.step(
            remediation_id, to_state=state, action=action, detail=detail, from_states=expect,
            owner=owner, **fields,
        )  # fmt: skip
        if not moved:
            raise LostRun(f"remediation {remediation_id} is no longer run by {owner}")
        # no URL's credentials on the card
        await self.show(remediation_id, note=redact(note), adr=adr)

    async def show(self, remediation_id: int, *, note: str, adr: Adr | None = None) -> None:
        """The card again, with ``note``; a card Slack refuses to update is only logged."""
        rem = await self._records.get(remediation_id)
        if rem.channel is None or rem.ts is None:
            return
        view = await self.view(remediation_id, note=note, adr=adr)
        try:
            await self._notifier.update_remediation(
                MessageRef(channel=rem.channel, ts=rem.ts), view=view
            )
        except RuleloopError:
            log.warning("could not update the card of remediation %s", remediation_id)

    async def permalink(self, rem: Remediation) -> str | None:
        """A link to the card (None without one, or when Slack does not give it)."""
        if not (rem.channel and rem.ts):
            return None
        return await self._notifier.permalink(MessageRef(channel=rem.channel, ts=rem.ts))

    async def view(
        self,
        remediation_id: int,
        *,
        tokens: dict[str, str] | None = None,
        note: str = "",
        adr: Adr | None = None,
    ) -> RemediationView:
        """What the card says now: the diff, the gates, the buttons while it is pending.
        ``adr``: the change's ADR where the caller has read it already (read once per change)."""
        rem = await self._records.get(remediation_id)
        subject = buttons.subject(SUBJECT, rem.id)
        if tokens is None:
            pending = rem.state == RemediationState.PENDING
            tokens = await self._records.tokens(subject) if pending else {}
        if adr is None:  # a card shown outside the run (a click, a sweep): read it here
            found = await asyncio.to_thread(self._adrs.find, rem.adr_id)  # off the loop
            adr = found[1] if found else None
        gates, relative = _shown_gates(rem, adr.gates if adr else None)
        spec = self._settings.targets.get(rem.target)
        return RemediationView(
            id=rem.id,
            adr_id=rem.adr_id,
            adr_title=adr.title if adr else "",
            target=rem.target,
            actuator=spec.actuator.kind if spec and spec.actuator else "none",
            requested_by=rem.requested_by,
            state=rem.state,
            diff=diff(rem.before.get("flags", {}), rem.after.get("flags", {})),
            gates=gates,
            relative_gates=relative,
            two_person=rem.approvals_needed > 1,
            approved_by=list(rem.approved_by),
            expires_at=await self._records.expires_at(subject),
            tokens=tokens,
            note=note,
            gateway=dict(rem.after.get("gateway") or {}),
            numbers=dict(rem.result.get("numbers", {})),
            before_numbers=dict(rem.result.get("before_numbers", {})),
            failures=list(rem.result.get("failures", [])),
            silence=silence_line(rem.silence),
        )


def silence_line(silence: dict[str, Any] | None) -> str:
    """The card's words for the change's silence ("" when none was asked for)."""
    if not silence:
        return ""
    if "error" in silence:
        return redact(f"alerts NOT silenced: {silence['error']}")
    ends = dt.datetime.fromisoformat(silence["ends_at"])
    if silence.get("expired"):
        return f"Alertmanager silence {silence['id']}: expired (alerts notify again)"
    return f"Alertmanager silence {silence['id']}: alerts silenced until {ends:%H:%M} UTC"


def _shown_gates(
    rem: Remediation, gates: AdrGates | None
) -> tuple[dict[str, float], dict[str, str]]:
    """The limits for the card (those the canary used once it ran) and the relative ones."""
    if gates is None:
        return {}, {}
    relative = {key: str(value) for key, value in gates.relative().items()}
    # until the before-run, a relative gate has no number: the card says what it waits for
    return judged_limits(gates, rem.result.get("gates")), relative
