"""The Alertmanager silence of one change: created when it starts applying, expired when it ends
(promoted, rolled back, failed), and swept by whichever replica resumes a dead run.

A silence that could not be created does not stop the change: the card and the audit log say
so and the change goes on, with the alerts left loud (a change is often the fix for what
alerts; refusing it for a missing silence would hold the fix back). An expiry Alertmanager
does not take stays on the record and is retried by the sweep; it ends by itself anyway.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

from bot.kernel import Settings
from bot.kernel.store import ACTIVE, Remediation
from bot.remediation import silences
from bot.remediation.records import RemediationRecords

log = logging.getLogger("ruleloop.remediation")


class ChangeSilencer:
    """Creates and expires the silences of changes, recording each on the remediation."""

    def __init__(
        self,
        *,
        settings: Settings,
        records: RemediationRecords,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        # the real time by default: Alertmanager judges a silence's start and end on its clock
        self._settings = settings
        self._records = records
        self._clock = clock

    async def start(self, rem: Remediation, *, link: str | None) -> None:
        """Silence the change's target (when its [targets.X.silence] is set); a failure is
        recorded (the card shows it) and the change goes on."""
        spec = self._settings.targets[rem.target].silence
        if spec is None:
            return
        now = self._clock()
        ends_at = now + dt.timedelta(seconds=spec.change_s + spec.settle_s)
        comment = f"ruleloop change #{rem.id}: {rem.adr_id} on {rem.target}" + (
            f"; incident: {link}" if link else ""
        )
        try:
            silence = await silences.create(
                rem.target, spec, starts_at=now, ends_at=ends_at, comment=comment
            )
        except silences.SilenceError as exc:
            await self._records.note_silence(
                rem.id, {"error": str(exc)}, action="remediation.silence_failed",
                detail={"error": str(exc)},
            )  # fmt: skip
            return
        await self._records.note_silence(
            rem.id, silence.to_json(), action="remediation.silenced",
            detail={**silence.to_json(), "matchers": spec.matchers, "comment": comment},
        )  # fmt: skip

    async def end(self, remediation: Remediation | int) -> Remediation:
        """Expire the silence of a change that ended (as its last step returned it, or read
        now by id), if it has one still on; never raises (the sweep retries what Alertmanager
        did not take). The remediation as it is then."""
        rem = remediation
        if not isinstance(rem, Remediation):
            rem = await self._records.get(rem)
        if rem.state not in ACTIVE:  # never the silence of a change another run still runs
            rem = await self._expire(rem) or rem
        return rem

    async def sweep(self) -> int:
        """Expire the silences of changes that ended without expiring theirs; how many."""
        expired = 0
        for rem in await self._records.unexpired_silences():
            expired += await self._expire(rem) is not None
        return expired

    async def _expire(self, rem: Remediation) -> Remediation | None:
        """The remediation with its silence expired, as written; None when there was none to
        expire, or Alertmanager did not take it."""
        kept: dict[str, Any] = dict(rem.silence or {})
        if not kept.get("id") or kept.get("expired"):
            return None
        try:
            await silences.expire(kept["alertmanager_url"], kept["id"])
        except silences.SilenceError as exc:
            log.warning("silence %s of remediation %s not expired: %s", kept["id"], rem.id, exc)
            await self._records.note_silence(
                rem.id, kept, action="remediation.silence_expire_failed",
                detail={"id": kept["id"], "error": str(exc)},
            )  # fmt: skip
            return None
        return await self._records.note_silence(
            rem.id, {**kept, "expired": True}, action="remediation.silence_expired",
            detail={"id": kept["id"], "state": rem.state},
        )  # fmt: skip
