"""The remediation flow: /apply-adr or an Apply click -> approval -> apply -> canary -> keep or
roll back, shown by updating one card in the incident's thread.

Every step is written to the audit log (with the remediation's new state, in one transaction)
before it starts. A bot that restarts mid-flow finds the unfinished remediation (its state and
a stale heartbeat) and rolls it back to the flags recorded before the change, or says it could
not. The run of one change is ``bot.remediation.run``; its card, ``bot.remediation.card``.
Nothing here imports Slack: the notifier renders the views.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from bot.adr import Adr, SharedAdrStore
from bot.change import (
    InForce,
    LostRun,
    Policy,
    Restorer,
    Sleep,
    TargetBusy,
    actuators,
    diff,
    in_force_of,
    merge,
    owned,
    refusal,
)
from bot.change.actuators import ActuatorFactory, opened
from bot.change.resume import resume as resume_changes
from bot.kernel import Settings, Target, UsageError
from bot.kernel.chat import MessageRef, mention
from bot.kernel.runtime import (
    BotMetrics,
    Members,
    TaskSupervisor,
    annotate,
    log_ids,
    replica_id,
    span,
)
from bot.kernel.store import (
    ActionToken,
    Change,
    ChangeKind,
    ChangeState,
    Database,
    Remediation,
    buttons,
)
from bot.remediation.card import Card
from bot.remediation.change_silence import ChangeSilencer
from bot.remediation.gate import GateRunner, run_gate
from bot.remediation.live_stage import LiveJudge, judge_live
from bot.remediation.ports import RemediationNotifier
from bot.remediation.records import ChangeRequest, RemediationRecords
from bot.remediation.run import HOLD_BUTTONS, ChangeRun, crashed, gateway_admin, like_for_like
from bot.tune import SessionRestorer, TuneRecords

log = logging.getLogger("ruleloop.remediation")

S = ChangeState
K = ChangeKind
ThreadFinder = Callable[[int, str | None], Awaitable[MessageRef]]
AfterChange = Callable[[int, str, Adr | None], Awaitable[None]]  # incident, author, its ADR


class RemediationService:
    """Requests, approvals, the apply/canary/rollback run, expiry and resume after a restart."""

    def __init__(
        self,
        *,
        settings: Settings,
        db: Database,
        adrs: SharedAdrStore,
        notifier: RemediationNotifier,
        threads: ThreadFinder,
        clock: Callable[[], dt.datetime],
        tasks: TaskSupervisor,
        actuator_for: ActuatorFactory = actuators.build,
        gate: GateRunner = run_gate,
        live: LiveJudge = judge_live,
        after_change: AfterChange | None = None,
        members: Members | None = None,
        sleep: Sleep = asyncio.sleep,
        metrics: BotMetrics | None = None,
    ) -> None:
        self.settings = settings
        self._db = db
        self.metrics = metrics or BotMetrics()  # the bot's (outcomes, canary verdicts)
        self.records = RemediationRecords(db=db, clock=clock, ended=self.metrics.remediation_ended)
        self.tuning = TuneRecords(db=db, clock=clock)
        self.policy = Policy(settings)
        self.card = Card(settings=settings, records=self.records, adrs=adrs, notifier=notifier)
        self.silencer = ChangeSilencer(settings=settings, records=self.records)
        self._adrs = adrs
        self._notifier = notifier
        self._threads = threads
        self._clock = clock
        self._tasks = tasks
        self._actuator_for = actuator_for
        self._gate = gate
        self._live = live
        self._after_change = after_change
        self._sleep = sleep  # between heartbeats
        self.members = members or Members(settings.access)

    # --- request ------------------------------------------------------------------------
    async def request(
        self,
        *,
        user_id: str,
        adr_id: str,
        target: str | None = None,
        incident_id: int | None = None,
        channel_id: str | None = None,
        offered: bool = False,
    ) -> str:
        """Check a request, post its confirmation card; the returned text acknowledges it.

        One change at a time per target: a request while another is pending or running there
        is refused (UsageError) with that one's id, state, requester and card. ``offered``: an
        Apply button's request, which may only apply what its incident's diagnosis offered,
        on that incident's target.
        """
        if offered:
            assert incident_id is not None
            target = await self.records.offered_target(incident_id, adr_id, target)
        adr = await asyncio.to_thread(self._adrs.get_or_raise, adr_id)
        if target is None and incident_id is not None:
            target = await self.records.incident_target(incident_id)
        name, spec = self.settings.target(target)
        try:
            rem, tokens = await self._create(
                user_id=user_id, adr=adr, name=name, spec=spec, incident_id=incident_id,
                channel_id=channel_id,
            )  # fmt: skip
        except TargetBusy as busy:
            link = None
            if busy.holder.channel and busy.holder.ts:
                link = await self._notifier.permalink(
                    MessageRef(channel=busy.holder.channel, ts=busy.holder.ts)
                )
            raise UsageError(refusal(adr.id, name, busy.holder, link)) from None
        thread = await self._threads(rem.incident_id, channel_id)
        # the buttons expire approval_ttl_s after the request (records.create issued them so)
        expires = rem.created_at + dt.timedelta(seconds=self.settings.remediation.approval_ttl_s)
        view = await self.card.view(rem, tokens=tokens, expires_at=expires, adr=adr)
        ref = await self._notifier.post_remediation(thread, view=view)
        await self.records.remember_card(rem.id, channel=ref.channel, ts=ref.ts)
        who = "another approver" if rem.approvals_needed > 1 else "an approver"
        return (
            f"{adr.id} on {name}: the confirmation card is in the incident thread; "
            f"{who} must approve it within "
            f"{self.settings.remediation.approval_ttl_s / 60:.0f} minutes."
        )

    async def _create(
        self, *, user_id: str, adr: Adr, name: str, spec: Target, incident_id: int | None,
        channel_id: str | None,
    ) -> tuple[Remediation, dict[str, str]]:  # fmt: skip
        """The pending change and its buttons, after every check that can refuse it."""
        plan = self.policy.check_request(
            user_id=user_id, adr=adr, target=name, members=await self.members()
        )
        # A request whose buttons expired no longer holds the target, even before the sweep.
        await self.expire_due()
        busy = await self.records.in_flight(name)
        if busy is not None:  # refused before the actuator is asked anything
            raise TargetBusy(busy)
        if adr.gates is not None:  # refused now rather than after the approval
            like_for_like(adr.id, adr.gates)
        async with opened(self._actuator_for, name, spec) as actuator:
            before = await actuator.current()
        after = merge(before.flags, plan.change)
        recorded, rules = before.to_json(), None
        if adr.fix.gateway is not None and spec.gateway_url is not None:
            rules = adr.fix.gateway.model_dump(exclude_none=True, exclude_unset=True)
            recorded["gateway"] = await gateway_admin(name, spec).limits()
        if not diff(before.flags, after) and rules is None:
            raise UsageError(
                f"{name} already runs with {adr.id}'s flags; there is nothing to apply."
            )
        return await self.records.create(
            ChangeRequest(
                incident_id=incident_id, channel_id=channel_id, adr_id=adr.id, target=name,
                user_id=user_id, two_person=plan.two_person, change=plan.change,
                before=recorded, after_flags=after, gateway_rules=rules,
                ttl_s=self.settings.remediation.approval_ttl_s,
            )
        )  # fmt: skip

    # --- buttons ------------------------------------------------------------------------
    async def click(self, *, user_id: str, token: str) -> None:
        """An Approve or Cancel click on a card: checked, then acted on exactly once."""
        row, rem = await self.records.clicked(token)
        if row is None or rem is None:
            raise UsageError(
                "This button is not one this bot issued (or its request was removed). "
                "Nothing was changed."
            )
        if row.kind in HOLD_BUTTONS:
            await self._decide_hold(user_id=user_id, token=token, row=row, rem=rem)
            return
        self._check_usable(row, rem)
        if row.kind == "approve":
            self.policy.check_approval(
                user_id=user_id,
                requested_by=rem.requested_by,
                two_person=rem.approvals_needed > 1,
                adr_id=rem.adr_id,
                members=await self.members(),
            )
            to_state, action = S.APPROVED, "remediation.approved"
        else:
            self.policy.check_cancel(
                user_id=user_id, requested_by=rem.requested_by, members=await self.members()
            )
            to_state, action = S.CANCELLED, "remediation.cancelled"
        won = await self.records.claim(
            token=token, user_id=user_id, remediation_id=rem.id, to_state=to_state,
            action=action, detail={"adr": rem.adr_id, "target": rem.target},
        )  # fmt: skip
        if won is None:
            raise UsageError("Someone else answered this request first. Nothing was changed.")
        if to_state == S.APPROVED:
            # read once for the approval's card and the run: the ADR as it is when approved
            found = await asyncio.to_thread(self._adrs.find, rem.adr_id)
            adr = found[1] if found else None
            await self.card.show(won, note=f"approved by {mention(user_id)}; starting", adr=adr)
            self._tasks.spawn(self.execute(rem.id, adr=adr), name=f"remediation-{rem.id}")
        else:
            await self.card.show(won, note=f"cancelled by {mention(user_id)}; nothing was changed")

    async def _decide_hold(
        self, *, user_id: str, token: str, row: ActionToken, rem: Remediation
    ) -> None:
        """Keep or Roll back on a held change (its canary could not decide): keeping takes an
        approver (and the two-person rule, as approving did); rolling back, the requester or
        any approver. Acted on once; the run goes on in the background."""
        self._check_usable(row, rem, state=S.HELD)
        keep = row.kind == "keep"
        members = await self.members()
        if keep:
            self.policy.check_approval(
                user_id=user_id, requested_by=rem.requested_by,
                two_person=rem.approvals_needed > 1, adr_id=rem.adr_id, members=members,
            )  # fmt: skip
        else:
            self.policy.check_cancel(
                user_id=user_id, requested_by=rem.requested_by, members=members
            )
        runner = replica_id()
        won = await self.records.claim(
            token=token, user_id=user_id, remediation_id=rem.id,
            to_state=S.CANARY if keep else S.ROLLING_BACK,
            action="remediation.hold_kept" if keep else "remediation.hold_rolled_back",
            detail={"adr": rem.adr_id, "target": rem.target}, from_state=S.HELD, runner=runner,
        )  # fmt: skip
        if won is None:
            raise UsageError("Someone else answered this hold first. Nothing was changed.")
        who = mention(user_id)
        if keep:
            await self.card.show(won, note=f"kept by {who} with the canary undecided; going on")
        reason = f"rolled back by {who}: the canary could not decide"
        self._finish(won, runner, keep_by=who if keep else None, reason=reason)

    def _finish(self, rem: Remediation, runner: str, *, keep_by: str | None, reason: str) -> None:
        """Go on with a held change in the background, as ``runner``: kept by ``keep_by``
        (the live stage, if any, then the rollout), or rolled back for ``reason``; the
        post-incident draft follows, as after a run."""
        ended: Remediation | None = None
        adr: Adr | None = None

        async def work(change: ChangeRun) -> None:
            nonlocal ended, adr
            adr = await asyncio.to_thread(self._adrs.get_or_raise, rem.adr_id)
            if keep_by is not None:
                await change.go_on(adr, rem, kept_by=keep_by)
            else:
                await change.roll_back(reason=reason, expect=[S.ROLLING_BACK])
            ended = change.latest

        async def finish() -> None:
            if await self._owned(rem, runner, work):
                await self._drafted(ended, adr)

        self._tasks.spawn(finish(), name=f"remediation {rem.id}: the hold decided")

    def _check_usable(
        self, row: ActionToken, rem: Remediation, *, state: ChangeState = S.PENDING
    ) -> None:
        """UsageError, saying why, for a button already used, expired, or of a decided change."""
        used = buttons.used_text(row, what=f"{rem.adr_id} is now {rem.state}")
        if used is not None:
            raise UsageError(used)
        if state == S.HELD and row.expires_at is not None and row.expires_at <= self._clock():
            raise UsageError(
                f"This hold ended at {row.expires_at:%H:%M} UTC: nobody decided in time, so the "
                "change is rolled back (or already was). Nothing else was changed."
            )
        if state == S.HELD and rem.state != S.HELD:
            raise UsageError(f"{rem.adr_id} on {rem.target} is already {rem.state}.")
        if state == S.HELD:
            return
        if row.expires_at is not None and row.expires_at <= self._clock():
            raise UsageError(
                f"This button expired at {row.expires_at:%H:%M} UTC (approval buttons last "
                f"{self.settings.remediation.approval_ttl_s / 60:.0f} minutes). Nothing was "
                f"changed; ask again with `/apply-adr {rem.adr_id} {rem.target}`."
            )
        if rem.state != S.PENDING:
            raise UsageError(f"{rem.adr_id} on {rem.target} is already {rem.state}.")

    # --- the run --------------------------------------------------------------------------
    async def execute(self, remediation_id: int, *, adr: Adr | None = None) -> None:
        """Apply, canary, then keep or roll back; every step audited before it starts, and
        conditional on this run still owning the change (else it stops, see liveness).
        ``adr``: the change's ADR as the approval read it (None: read it here; one gone since
        the request stops the run, saying so); the run and the draft use that one."""
        runner = replica_id()
        with log_ids(change_id=remediation_id):
            took = await self.records.take(remediation_id, runner=runner)
            if took is None:
                log.warning("remediation %s is run elsewhere already: not here", remediation_id)
                return
        taken, adr_id, ended = took.rem, took.rem.adr_id, None

        async def run(change: ChangeRun) -> None:
            nonlocal adr, ended
            if adr is None:
                adr = await asyncio.to_thread(self._adrs.get_or_raise, adr_id)
            in_force = await asyncio.to_thread(self._in_force, taken.target, took.promoted)
            await change.run(adr, in_force)
            ended = change.latest

        with log_ids(incident_id=taken.incident_id, change_id=taken.id):
            if not await self._owned(taken, runner, run):
                return  # taken over: its new owner finishes it (and drafts)
            await self._drafted(ended or await self.records.get(remediation_id), adr)

    def _in_force(self, target: str, promoted: Remediation | None) -> InForce:
        """The ADRs in force on ``target``, whose newest promoted change is ``promoted`` (their
        gates are the change's guardrails)."""
        own = self.settings.scheduler.targets.get(target)
        listed = own.adrs if own is not None else []
        return in_force_of(promoted, self._adrs, target=target, listed=listed)

    async def _owned(
        self, rem: Remediation, runner: str, work: Callable[[ChangeRun], Coroutine[Any, Any, None]]
    ) -> bool:
        """Do ``work`` on the change as ``runner``, with heartbeats and one actuator (closed at
        the end); a crash is reported on the card. False when the run lost the change to
        another replica (and stopped)."""

        async def beat() -> bool:
            return await self.records.heartbeat(rem.id, runner=runner)

        async def guarded() -> None:
            try:
                name, spec = self.settings.target(rem.target)
                async with opened(self._actuator_for, name, spec) as actuator:
                    change = ChangeRun(
                        rem=rem, runner=runner, actuator=actuator, settings=self.settings,
                        records=self.records, card=self.card, gate=self._gate,
                        silencer=self.silencer, live=self._live, metrics=self.metrics,
                    )  # fmt: skip
                    await work(change)
                    annotate(verdict=str(change.latest.state) if change.latest else None)
            except LostRun:
                raise
            except Exception as exc:
                await crashed(self.card, rem.id, exc, owner=runner)
                await self.silencer.end(rem.id)

        # every run of a change (approved, kept, resumed) logs with its incident and change
        # ids, and is a trace of its own (linked to the one it was started in, if any)
        with (
            log_ids(incident_id=rem.incident_id, change_id=rem.id),
            span("remediation", root=True, adr_id=rem.adr_id, target=rem.target, runner=runner),
        ):
            return await owned(
                guarded(), beat, every_s=self.settings.remediation.heartbeat_s,
                name=f"remediation {rem.id}", sleep=self._sleep,
            )  # fmt: skip

    # --- housekeeping (at startup and on a schedule) ----------------------------------------
    async def resume(self, *, stale_s: float | None = None) -> int:
        """Finish what a stopped replica left half done, of every kind of change (the one
        resume path, ``bot.change.resume``): a remediation rolled back to its recorded flags
        (``take_over``), a tuning session or drift before-run restored
        (``bot.tune.on_target.SessionRestorer``).

        Stale means no step or heartbeat for ``stale_s`` (default ``[remediation]
        stale_after_s``) on the database's clock; taking a change over is one conditional
        UPDATE that checks it again, so a run that beat meanwhile keeps its change. How many
        were taken over."""
        if stale_s is None:
            stale_s = self.settings.remediation.stale_after_s
        sessions = SessionRestorer(self.settings, self.tuning, self._actuator_for)
        restorers: dict[str, Restorer] = {
            K.REMEDIATION: self, K.TUNING: sessions, K.DRIFT_BEFORE_RUN: sessions,
        }  # fmt: skip
        taken = await resume_changes(self._db, restorers, stale_s=stale_s)
        # what a dead run (or an Alertmanager that did not answer) left silenced
        await self.silencer.sweep()
        return taken

    async def take_over(self, change: Change, *, stale_s: float) -> bool:
        """Roll back a remediation whose run went silent (one nothing was applied for yet is
        marked interrupted; one between the steps of its live stage goes on, in the
        background); True when this process took it over."""
        assert isinstance(change, Remediation), change.kind
        rem, runner = change, replica_id()
        if self._live_stage_left(rem):
            return await self._go_on(rem, runner, stale_s=stale_s)
        won = await self.records.step(
            rem.id,
            to_state=S.ROLLING_BACK if rem.state != S.APPROVED else S.INTERRUPTED,
            action="remediation.resumed",
            detail={"found_in": rem.state, "was_run_by": rem.runner},
            from_states=[rem.state],
            stale_s=stale_s,
            runner=runner,
        )
        if won is None:
            return False  # another replica took it, or its run beat again meanwhile
        if rem.state == S.APPROVED:  # nothing was applied yet
            await self.card.show(won, note="the bot restarted before applying; nothing was changed")
            return True
        reason = f"the bot restarted while this change was {rem.state}"

        async def roll_back(change: ChangeRun) -> None:
            await change.roll_back(reason=reason, expect=[S.ROLLING_BACK])

        await self._owned(won, runner, roll_back)
        return True

    def _live_stage_left(self, rem: Remediation) -> bool:
        """A change whose canary met the gates and whose live stage was under way (its steps
        on the record), on a target that still has one: it can go on where it stopped."""
        if rem.state != S.CANARY or "live" not in rem.result:
            return False
        spec = self.settings.targets.get(rem.target)
        return spec is not None and spec.live_stage is not None

    async def _go_on(self, rem: Remediation, runner: str, *, stale_s: float) -> bool:
        """Take over a live stage left between steps and finish it in the background (judge the
        steps left, then keep or roll back); the post-incident draft follows, as after a run."""
        judged = len(rem.result.get("live") or [])
        won = await self.records.step(
            rem.id, to_state=S.CANARY, action="remediation.resumed",
            detail={"found_in": rem.state, "was_run_by": rem.runner, "live_steps_judged": judged},
            from_states=[S.CANARY], stale_s=stale_s, runner=runner,
        )  # fmt: skip
        if won is None:
            return False
        steps = self.settings.targets[rem.target].live_stage
        of = f"/{steps.steps}" if steps is not None else ""
        await self.card.show(
            won,
            note=f"the bot restarted during the live stage: going on with step {judged + 1}{of}",
        )
        ended: Remediation | None = None
        adr: Adr | None = None

        async def go_on(change: ChangeRun) -> None:
            nonlocal ended, adr
            adr = await asyncio.to_thread(self._adrs.get_or_raise, rem.adr_id)
            await change.go_on(adr, won)
            ended = change.latest

        async def finish() -> None:
            if not await self._owned(won, runner, go_on):
                return  # taken over again: its new owner finishes it
            await self._drafted(ended, adr)

        self._tasks.spawn(finish(), name=f"remediation {rem.id}: the live stage, resumed")
        return True

    async def _drafted(self, rem: Remediation | None, adr: Adr | None) -> None:
        """The post-incident draft of a change that ended promoted or rolled back."""
        if (
            self._after_change is None
            or rem is None
            or rem.state not in (S.PROMOTED, S.ROLLED_BACK)
        ):
            return
        try:
            await self._after_change(rem.incident_id, rem.requested_by, adr)
        except Exception:
            log.exception("post-incident draft for remediation %s failed", rem.id)

    async def expire_due(self) -> int:
        """Pending requests whose buttons expired: mark them expired and say so on the card.
        Held changes nobody decided in time: roll them back (failing safe)."""
        count = 0
        for rem in await self.records.expired_pending():
            if rem.state == S.HELD:
                count += await self._hold_expired(rem)
            elif await self.records.step(
                rem.id,
                to_state=S.EXPIRED,
                action="remediation.expired",
                detail={},
                from_states=[S.PENDING],
            ):
                count += 1
                await self.card.show(rem.id, note="nobody approved in time; nothing was changed")
        return count

    async def _hold_expired(self, rem: Remediation) -> bool:
        """Roll back a held change nobody kept in time (in the background); False when a
        click or another replica moved it first."""
        runner = replica_id()
        won = await self.records.step(
            rem.id, to_state=S.ROLLING_BACK, action="remediation.hold_expired", detail={},
            from_states=[S.HELD], runner=runner,
        )  # fmt: skip
        if won is None:
            return False
        ttl = self.settings.remediation.hold_ttl_s / 60
        reason = f"held {ttl:.0f} minutes with the canary undecided and nobody kept it"
        self._finish(won, runner, keep_by=None, reason=reason)
        return True
