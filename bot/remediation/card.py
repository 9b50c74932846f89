"""The one card a change shows in the incident's thread: its view, updated at every step.

A step is a conditional state move (audited in the same transaction) and then the card again;
a run that no longer owns the change gets ``LostRun`` and has changed nothing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from bot.adr import Adr, AdrGates, SharedAdrStore
from bot.canary import judged_limits
from bot.change import LostRun, diff
from bot.kernel import RuleloopError, Settings
from bot.kernel.chat import MessageRef
from bot.kernel.runtime.redact import redact
from bot.kernel.store import ChangeState, Remediation, buttons
from bot.remediation.ports import RemediationNotifier, RemediationView
from bot.remediation.records import SUBJECT, RemediationRecords

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
        state: ChangeState,
        action: str,
        detail: dict[str, Any],
        *,
        note: str,
        owner: str,
        expect: list[ChangeState],
        adr: Adr | None = None,
        show: bool = True,
        **fields: Any,
    ) -> Remediation:
        """Move to ``state`` from one of ``expect`` as run ``owner`` (audited, then shown on
        the card unless ``show`` is False: the caller shows it once it is done); LostRun,
        having changed nothing, when the change is not that any more. ``fields`` are the
        record's columns the step sets too (its result, what serves); ``adr``: the change's ADR
        as its run read it (else the card reads it). The remediation as the step wrote it."""
        moved = await self._records.step(
            remediation_id, to_state=state, action=action, detail=detail, from_states=expect,
            owner=owner, **fields,
        )  # fmt: skip
        if moved is None:
            raise LostRun(f"remediation {remediation_id} is no longer run by {owner}")
        if show:  # no URL's credentials on the card
            await self.show(moved, note=redact(note), adr=adr)
        return moved

    async def show(
        self, remediation: Remediation | int, *, note: str, adr: Adr | None = None
    ) -> None:
        """The card again, with ``note``, of the remediation as a step returned it (or read
        now, given its id); a card Slack refuses to update is only logged."""
        rem = await self._row(remediation)
        if rem.channel is None or rem.ts is None:
            return
        view = await self.view(rem, note=note, adr=adr)
        try:
            await self._notifier.update_remediation(
                MessageRef(channel=rem.channel, ts=rem.ts), view=view
            )
        except RuleloopError:
            log.warning("could not update the card of remediation %s", rem.id)

    async def _row(self, remediation: Remediation | int) -> Remediation:
        if isinstance(remediation, Remediation):
            return remediation
        return await self._records.get(remediation)

    async def permalink(self, rem: Remediation) -> str | None:
        """A link to the card (None without one, or when Slack does not give it)."""
        if not (rem.channel and rem.ts):
            return None
        return await self._notifier.permalink(MessageRef(channel=rem.channel, ts=rem.ts))

    async def view(
        self,
        remediation: Remediation | int,
        *,
        tokens: dict[str, str] | None = None,
        expires_at: dt.datetime | None = None,
        note: str = "",
        adr: Adr | None = None,
    ) -> RemediationView:
        """What the card says now: the diff, the gates, the buttons while it is pending or held.
        ``tokens`` and ``expires_at``: the buttons as the request issued them (else read);
        ``adr``: the change's ADR where the caller has read it already (read once per change)."""
        rem = await self._row(remediation)
        # only a pending request's card and a held change's have buttons, and an expiry
        if rem.state not in (ChangeState.PENDING, ChangeState.HELD):
            tokens, expires_at = {}, None
        elif tokens is None or expires_at is None:  # not given by the request that made them
            subject = buttons.subject(SUBJECT, rem.id)
            tokens, expires_at = await self._records.pending_buttons(subject, tokens=tokens)
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
            expires_at=expires_at,
            tokens=tokens or {},
            note=note,
            gateway=dict(rem.after.get("gateway") or {}),
            numbers=dict(rem.result.get("numbers", {})),
            before_numbers=dict(rem.result.get("before_numbers", {})),
            failures=list(rem.result.get("failures", [])),
            silence=silence_line(rem.silence),
            how_sure=[str(line) for line in rem.result.get("how_sure", [])],
            watched=[str(line) for line in rem.result.get("watched", [])],
            live=[str(line) for line in rem.result.get("live", [])],
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
    return judged_limits(gates, rem.result.get("gates")).limits(), relative
