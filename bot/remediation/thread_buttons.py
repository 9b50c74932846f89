"""The incident thread's Silence 1h, Acknowledge and Cause confirmed / Wrong cause buttons
(docs/bot.md, docs/remediation.md#silences, docs/adr.md#causes): single-use, checked like the
remediation card's buttons (the workspace guard, the ``[access] apply`` list with user groups
expanded), claimed in one conditional UPDATE with their
audit entry, so of a double click or one click delivered to two replicas one acts.

Acknowledge keeps who pressed it on the incident and re-renders the root through the outbox.
Silence creates an Alertmanager silence of the target's matchers for ``thread_silence_s``; the
thread says until when and its id, or why it could not (with a fresh Silence button), never a
stack trace. Cause confirmed / Wrong cause keep on-call's word on the diagnosis's supported cause
(``cause_feedback``: `ruleloop adr stats` counts it, the next thread on the target says a cause
was marked wrong); one press spends the pair.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.orm import Session

from bot.kernel import NotAllowed, Settings, SilenceSpec, UsageError
from bot.kernel.chat import (
    ACKNOWLEDGE,
    CAUSE,
    CAUSE_CONFIRMED,
    CAUSE_WRONG,
    RETUNE,
    SILENCE,
    escape,
    mention,
    plain,
)
from bot.kernel.runtime import Members, new_error_id, who_may
from bot.kernel.store import ActionToken, CauseFeedback, Database, Incident, buttons
from bot.kernel.store import outbox as items
from bot.kernel.store import service as store
from bot.remediation import silences
from bot.tune import Retune

log = logging.getLogger("ruleloop.thread")
RenderButtons = Callable[..., dict[str, Any]]  # Notifier.render_thread_buttons


def duration_text(seconds: float) -> str:
    """'1h', '90min', '3s': how long a silence lasts, as the thread says it."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}min"
    return f"{seconds:g}s"


class ThreadButtons(buttons.ButtonReads):
    """Acts on a press of an incident thread's Silence or Acknowledge button, once."""

    def __init__(
        self,
        *,
        settings: Settings,
        db: Database,
        clock: Callable[[], dt.datetime],
        members: Members,
        deliver: Callable[[int], Awaitable[object]],
        render: RenderButtons,
        wall_clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        retune: Retune | None = None,
    ) -> None:
        self._settings = settings
        self._db = db
        self._clock = clock
        self._members = members
        self._deliver = deliver  # the incident's outbox delivery
        self._render = render
        self._wall_clock = wall_clock  # Alertmanager judges a silence's times on its clock
        self._retune = retune  # a drift thread's Re-tune button (None: the bot offers none)

    async def press(self, *, user_id: str, token: str) -> str | None:
        """Check the press, act on it once; UsageError/NotAllowed says why not (only to the
        presser). The thread (or the root message) shows the outcome."""
        row = await self.token(token)
        kind, incident_id = _button_of(row)
        assert row is not None
        used = buttons.used_text(row, what=f"incident #{incident_id}")
        if used is not None:
            raise UsageError(used)
        if kind == RETUNE and self._retune is not None:  # its own rule: an approver starts it
            await self._retune.press(user_id=user_id, token=token, incident_id=incident_id)
            return None
        if not (await self._members()).allows("apply", user_id):
            what = "judge the cause of" if kind == CAUSE else "silence or acknowledge"
            raise NotAllowed(
                f"You may not {what} incidents. Allowed: "
                f"{who_may(self._settings.access.apply)}. Nothing was changed."
            )
        if kind == ACKNOWLEDGE:
            await asyncio.to_thread(self._acknowledge, incident_id, token, user_id)
        elif kind == CAUSE:
            await asyncio.to_thread(self._judge_cause, incident_id, row.kind, token, user_id)
        else:
            await self._silence(incident_id, token, user_id)
        await self._deliver(incident_id)
        return None

    def _acknowledge(self, incident_id: int, token: str, user_id: str) -> None:
        """Claim the button, keep who acknowledged, audit, owe the root's re-render: one step."""
        now = self._clock()
        with self._db.transaction() as s:
            incident = _claim(s, token, user_id, now=now, action="incident.acknowledged",
                              detail={})  # fmt: skip
            incident.acknowledged_by, incident.acknowledged_at = user_id, now
            items.owe_root_change(s, incident_id, at=now)

    def _judge_cause(self, incident_id: int, verdict: str, token: str, user_id: str) -> None:
        """Claim the pair, keep on-call's word on the supported cause, audit it and say it in
        the thread: one step."""
        now = self._clock()
        with self._db.transaction() as s:
            incident = store.get(s, incident_id)
            assert incident is not None
            causes = incident.summary.supported()
            if not causes:  # a later diagnosis of the incident supports none
                raise UsageError("This diagnosis names no cause any more. Nothing was changed.")
            word = "confirmed" if verdict == CAUSE_CONFIRMED else "wrong"
            adr_ids = list(incident.summary.matches)
            _claim(s, token, user_id, now=now, action=f"cause.{word}",
                   detail={"cause": causes[0], "adrs": adr_ids})  # fmt: skip
            s.add(CauseFeedback(incident_id=incident_id, target=incident.target or "",
                                cause=causes[0], verdict=word, adr_ids=adr_ids, actor=user_id,
                                at=now))  # fmt: skip
            said = "confirmed the cause" if word == "confirmed" else "marked the cause wrong"
            text = f":memo: {mention(user_id)} {said}: *{escape(causes[0])}*"
            items.owe(s, incident_id, kind=items.REPLY, at=now, payload={"text": text})

    async def _silence(self, incident_id: int, token: str, user_id: str) -> None:
        """Claim the button, then ask Alertmanager; the thread hears the outcome."""
        incident, spec = await asyncio.to_thread(self._claim_silence, incident_id, token, user_id)
        seconds = spec.thread_silence_s
        start = self._wall_clock()
        comment = (
            f"ruleloop incident #{incident_id} ({incident.title}) on {incident.target}: "
            f"silenced from its Slack thread by {user_id}"
        )
        try:
            made = await silences.create(
                str(incident.target), spec, starts_at=start,
                ends_at=start + dt.timedelta(seconds=seconds), comment=comment,
            )  # fmt: skip
        except Exception as exc:
            await asyncio.to_thread(self._silence_failed, incident_id, user_id, exc)
            return
        text = (
            f":no_bell: Alerts of *{plain(str(incident.target), 200)}* silenced for "
            f"{duration_text(seconds)} by {mention(user_id)} until {made.ends_at:%H:%M} UTC "
            f"(Alertmanager silence {plain(made.id, 100)})"
        )
        detail = {**made.to_json(), "matchers": silences.matchers(str(incident.target), spec)}
        await asyncio.to_thread(self._outcome, incident_id, user_id, "incident.silenced", detail,
                                {"text": text})  # fmt: skip

    def _claim_silence(
        self, incident_id: int, token: str, user_id: str
    ) -> tuple[Incident, SilenceSpec]:
        now = self._clock()
        with self._db.transaction() as s:
            incident = store.get(s, incident_id)
            assert incident is not None
            if incident.status == store.RESOLVED:  # a button outlives its incident's alerts
                raise UsageError(
                    f"Incident #{incident_id} is over: this incident is resolved; nothing "
                    "silenced. Nothing was changed."
                )
            target = self._settings.targets.get(incident.target or "")
            if target is None or target.silence is None:
                raise UsageError(
                    f"{incident.target or 'this incident'} has no [targets.X.silence] any more: "
                    "nothing to silence with. Nothing was changed."
                )
            _claim(s, token, user_id, now=now, action="incident.silence_requested",
                   detail={"for_s": target.silence.thread_silence_s})  # fmt: skip
            s.expunge(incident)
            return incident, target.silence

    def _silence_failed(self, incident_id: int, user_id: str, exc: Exception) -> None:
        """Say why in the thread, with a fresh Silence button; the log has any traceback."""
        if isinstance(exc, silences.SilenceError):
            why, detail = escape(str(exc)), {"error": str(exc)}
        else:
            error_id = new_error_id()
            log.error("silence of incident %s failed (id %s)", incident_id, error_id, exc_info=exc)
            why = f"unexpected error (id {error_id}; see the bot's log)"
            detail = {"error_id": error_id}
        note = f":warning: Alerts NOT silenced (pressed by {mention(user_id)}): {why}"
        self._outcome(incident_id, user_id, "incident.silence_failed", detail, None, note=note)

    def _outcome(
        self, incident_id: int, user_id: str, action: str, detail: dict[str, Any],
        message: dict[str, Any] | None, *, note: str | None = None,
    ) -> None:  # fmt: skip
        """Audit a silence's outcome and owe its thread message (``note``: with a new button)."""
        now = self._clock()
        with self._db.transaction() as s:
            incident = store.get(s, incident_id)
            store.audit(s, at=now, actor=user_id, action=action, incident=incident, detail=detail)
            if message is None:
                tokens = buttons.issue(s, buttons.subject(SILENCE, incident_id), [SILENCE],
                                       incident_id=incident_id, now=now)  # fmt: skip
                message = self._render(tokens, note=note)
            items.owe(s, incident_id, kind=items.REPLY, at=now, payload=message)


def _button_of(row: ActionToken | None) -> tuple[str, int]:
    """The kind of a thread button and its incident; UsageError when it is not one."""
    for kind in (SILENCE, ACKNOWLEDGE, CAUSE, RETUNE):
        key = buttons.subject_key(row.subject, kind) if row is not None else None
        if kind == CAUSE and row is not None and row.kind not in (CAUSE_CONFIRMED, CAUSE_WRONG):
            continue
        if key is not None and key.isdigit():
            return kind, int(key)
    raise UsageError("This button is not one this bot issued. Nothing was changed.")


def _claim(
    s: Session, token: str, user_id: str, *, now: dt.datetime, action: str, detail: dict[str, Any]
) -> Incident:
    """Use the button with its audit entry (the caller's transaction); UsageError when someone
    else was first."""
    row = buttons.find(s, token)
    if row is None or not buttons.use(s, token, user_id=user_id, now=now):
        raise UsageError("Someone else pressed this button first. Nothing was changed.")
    incident = store.get(s, row.incident_id) if row.incident_id is not None else None
    assert incident is not None
    store.audit(s, at=now, actor=user_id, action=action, incident=incident,
                detail={"token": token[:6], **detail})  # fmt: skip
    return incident
