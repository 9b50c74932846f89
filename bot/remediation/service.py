"""The remediation flow: /apply-adr or an Apply click -> approval -> apply -> canary -> keep or
roll back, shown by updating one card in the incident's thread.

Every step is written to the audit log (with the remediation's new state, in one transaction)
before it starts. A bot that restarts mid-flow finds the unfinished remediation (its state and
a stale heartbeat) and rolls it back to the flags recorded before the change, or says it could
not. Nothing here imports Slack: the notifier renders the views.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from bot.adr.models import Adr, AdrGates, GatewayRules
from bot.adr.relative import BEFORE, NORMAL, unlike_gate
from bot.adr.shared import SharedAdrStore
from bot.chat.messages import MessageRef
from bot.config import Settings, Target
from bot.errors import RuleloopError, UsageError
from bot.remediation import actuators
from bot.remediation.actuators.base import Actuator, ActuatorError, Deployed, TakesContext
from bot.remediation.argv import diff, merge
from bot.remediation.change_note import give_context
from bot.remediation.exclusion import TargetBusy, refusal
from bot.remediation.gate import GateRun, GateRunner, run_gate, verify_serving
from bot.remediation.gateway_rules import GatewayAdmin
from bot.remediation.liveness import LostRun, owned
from bot.remediation.policy import Policy
from bot.remediation.ports import ACTIVE, RemediationNotifier, RemediationView
from bot.remediation.records import RemediationRecords
from bot.remediation.tune_records import TuneRecords
from bot.remediation.tuning import restore_stale
from bot.runtime.access import Members
from bot.runtime.ids import new_error_id, replica_id
from bot.runtime.redact import redact
from bot.runtime.tasks import TaskSupervisor
from bot.store.db import Database
from bot.store.models import Remediation
from bot.store.readings import ROLLBACK_FAILED

log = logging.getLogger("ruleloop.remediation")

ThreadFinder = Callable[[int, str | None], Awaitable[MessageRef]]
ActuatorFactory = Callable[[str, Target], Actuator]
AfterChange = Callable[[int, str], Awaitable[None]]


class RemediationService:
    """Requests, approvals, the apply/canary/rollback run, expiry and resume after a restart."""

    def __init__(
        self,
        *,
        settings: Settings,
        db: Database,
        notifier: RemediationNotifier,
        threads: ThreadFinder,
        clock: Callable[[], dt.datetime],
        tasks: TaskSupervisor,
        actuator_for: ActuatorFactory = actuators.build,
        gate: GateRunner = run_gate,
        after_change: AfterChange | None = None,
        members: Members | None = None,
    ) -> None:
        self.settings = settings
        self.records = RemediationRecords(db=db, clock=clock)
        self.tuning = TuneRecords(db=db, clock=clock)
        self.policy = Policy(settings)
        self._adrs = SharedAdrStore(root=settings.paths.adr, db=db, clock=clock)
        self._notifier = notifier
        self._threads = threads
        self._clock = clock
        self._tasks = tasks
        self._actuator_for = actuator_for
        self._gate = gate
        self._after_change = after_change
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
    ) -> str:
        """Check a request, post its confirmation card; the returned text acknowledges it.

        One change at a time per target: a request while another is pending or running there
        is refused (UsageError) with that one's id, state, requester and card.
        """
        adr = await asyncio.to_thread(self._adrs.get_or_raise, adr_id)
        if target is None and incident_id is not None:
            target = await asyncio.to_thread(self.records.incident_target, incident_id)
        name, spec = self.settings.target(target)
        try:
            return await self._request(
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

    async def _request(
        self,
        *,
        user_id: str,
        adr: Adr,
        name: str,
        spec: Target,
        incident_id: int | None,
        channel_id: str | None,
    ) -> str:
        plan = self.policy.check_request(
            user_id=user_id, adr=adr, target=name, members=await self.members()
        )
        # A request whose buttons expired no longer holds the target, even before the sweep.
        await self.expire_due()
        busy = await asyncio.to_thread(self.records.in_flight, name)
        if busy is not None:  # refused before the actuator is asked anything
            raise TargetBusy(busy)
        if adr.gates is not None:  # refused now rather than after the approval
            like_for_like(adr.id, adr.gates)
        actuator = self._actuator_for(name, spec)
        before = await actuator.current()
        after = merge(before.flags, plan.change)
        recorded, rules = before.to_json(), None
        if adr.fix.gateway is not None and spec.gateway_url is not None:
            rules = adr.fix.gateway.model_dump(exclude_none=True, exclude_unset=True)
            recorded["gateway"] = await self._gateway(name, spec).limits()
        if not diff(before.flags, after) and rules is None:
            raise UsageError(
                f"{name} already runs with {adr.id}'s flags; there is nothing to apply."
            )
        rem, tokens = await asyncio.to_thread(
            self.records.create,
            incident_id=incident_id,
            channel_id=channel_id,
            adr_id=adr.id,
            target=name,
            user_id=user_id,
            two_person=plan.two_person,
            change=plan.change,
            before=recorded,
            after_flags=after,
            gateway_rules=rules,
            ttl_s=self.settings.remediation.approval_ttl_s,
        )
        thread = await self._threads(rem.incident_id, channel_id)
        ref = await self._notifier.post_remediation(
            thread, view=await self._view(rem.id, tokens=tokens)
        )
        await asyncio.to_thread(self.records.remember_card, rem.id, channel=ref.channel, ts=ref.ts)
        who = "another approver" if plan.two_person else "an approver"
        return (
            f"{adr.id} on {name}: the confirmation card is in the incident thread; "
            f"{who} must approve it within "
            f"{self.settings.remediation.approval_ttl_s / 60:.0f} minutes."
        )

    # --- buttons ------------------------------------------------------------------------
    async def click(self, *, user_id: str, token: str) -> None:
        """An Approve or Cancel click on a card: checked, then acted on exactly once."""
        row = await asyncio.to_thread(self.records.token, token)
        if row is None or not row.subject.startswith("remediation:"):
            raise UsageError(
                "This button is not one this bot issued (or its request was removed). "
                "Nothing was changed."
            )
        rem = await asyncio.to_thread(self.records.get, int(row.subject.split(":")[1]))
        if row.used_at is not None:
            raise UsageError(
                f"This button was already used by <@{row.used_by}> at "
                f"{row.used_at:%H:%M:%S} UTC ({rem.adr_id} is now {rem.state}). "
                "Nothing was changed."
            )
        if row.expires_at is not None and row.expires_at <= self._clock():
            raise UsageError(
                f"This button expired at {row.expires_at:%H:%M} UTC (approval buttons last "
                f"{self.settings.remediation.approval_ttl_s / 60:.0f} minutes). Nothing was "
                f"changed; ask again with `/apply-adr {rem.adr_id} {rem.target}`."
            )
        if rem.state != "pending":
            raise UsageError(f"{rem.adr_id} on {rem.target} is already {rem.state}.")
        if row.kind == "approve":
            self.policy.check_approval(
                user_id=user_id,
                requested_by=rem.requested_by,
                two_person=rem.approvals_needed > 1,
                adr_id=rem.adr_id,
                members=await self.members(),
            )
            to_state, action = "approved", "remediation.approved"
        else:
            self.policy.check_cancel(
                user_id=user_id, requested_by=rem.requested_by, members=await self.members()
            )
            to_state, action = "cancelled", "remediation.cancelled"
        won = await asyncio.to_thread(
            self.records.claim,
            token=token,
            user_id=user_id,
            remediation_id=rem.id,
            to_state=to_state,
            action=action,
            detail={"adr": rem.adr_id, "target": rem.target},
        )
        if not won:
            raise UsageError("Someone else answered this request first. Nothing was changed.")
        note = (
            f"approved by <@{user_id}>; starting"
            if to_state == "approved"
            else f"cancelled by <@{user_id}>; nothing was changed"
        )
        await self._show(rem.id, note=note)
        if to_state == "approved":
            self._tasks.spawn(self.execute(rem.id), name=f"remediation-{rem.id}")

    # --- the run --------------------------------------------------------------------------
    async def execute(self, remediation_id: int) -> None:
        """Apply, canary, then keep or roll back; every step audited before it starts, and
        conditional on this run still owning the change (else it stops, see liveness)."""
        runner = replica_id()
        if not await asyncio.to_thread(self.records.take, remediation_id, runner=runner):
            log.warning("remediation %s is run elsewhere already: not here", remediation_id)
            return
        if not await self._owned(remediation_id, runner, self._run(remediation_id, runner)):
            return  # taken over: its new owner finishes it (and drafts)
        rem = await asyncio.to_thread(self.records.get, remediation_id)
        if self._after_change is not None and rem.state in ("promoted", "rolled_back"):
            try:
                await self._after_change(rem.incident_id, rem.requested_by)
            except Exception:
                log.exception("post-incident draft for remediation %s failed", remediation_id)

    async def _owned(
        self, remediation_id: int, runner: str, work: Coroutine[Any, Any, None]
    ) -> bool:
        """Do ``work`` as ``runner``, with heartbeats; a crash is reported on the card. False
        when the run lost the change to another replica (and stopped)."""

        async def beat() -> bool:
            return await asyncio.to_thread(self.records.heartbeat, remediation_id, runner=runner)

        async def guarded() -> None:
            try:
                await work
            except LostRun:
                raise
            except Exception as exc:
                await self._crashed(remediation_id, exc, owner=runner)

        return await owned(
            guarded(), beat, every_s=self.settings.remediation.heartbeat_s,
            name=f"remediation {remediation_id}",
        )  # fmt: skip

    async def _run(self, remediation_id: int, runner: str) -> None:
        rem = await asyncio.to_thread(self.records.get, remediation_id)
        adr = await asyncio.to_thread(self._adrs.get_or_raise, rem.adr_id)
        name, spec = self.settings.target(rem.target)
        actuator = self._actuator_for(name, spec)
        before = Deployed.from_json(rem.before)
        flags = dict(rem.after["flags"])
        if actuator.kind == "dry-run":
            await self._step(
                rem.id, "dry_run", "remediation.dry_run", {"flags": flags},
                note="dry run: the flags above would be set; nothing was changed",
                owner=runner, expect=["approved"],
            )  # fmt: skip
            return
        assert adr.gates is not None  # the policy refused ADRs without gates
        try:
            like_for_like(adr.id, adr.gates)
            # 'Nx before' gates need the before-run: the same canary on the flags serving now
            measured = None
            if spec.canary.baseline or adr.gates.relative(BEFORE):
                measured = await self._baseline(rem, spec, before, adr, runner)
            was = None if measured is None else measured.values.four()
            gates = adr.gates.resolve({}, before=was)
        except UsageError as exc:
            await self._step(
                rem.id, "cancelled", "remediation.cancelled", {"reason": str(exc)},
                note=f"nothing was changed: {exc}", owner=runner, expect=["approved"],
            )  # fmt: skip
            return
        limits = gates.model_dump(exclude_none=True)  # what the canary checks, as numbers
        await self._give_context(actuator, rem, before, adr_title=adr.title, numbers=was)
        await self._step(
            rem.id, "applying", "remediation.applying",
            {"flags": flags, "before": rem.before, "gates": limits,
             "gates_as_written": adr.gates.describe(gates)},
            note=f"applying with the {actuator.kind} actuator…",
            result={"gates": limits, "before_numbers": was or {}},
            owner=runner, expect=["approved"],
        )  # fmt: skip
        try:
            deployed = await actuator.apply(flags)
            if rem.after.get("gateway") is not None:
                await self._gateway(name, spec).apply(GatewayRules(**rem.after["gateway"]))
        except (ActuatorError, UsageError) as exc:
            await self._roll_back(
                rem, actuator, before, reason=f"the change failed: {exc}", owner=runner,
                expect=["applying"],
            )  # fmt: skip
            return
        await self._step(
            rem.id, "canary", "remediation.canary_started",
            {"base_url": redact(deployed.base_url), "flags": deployed.flags,
             "workload": spec.canary.model_dump()},
            note=f"canary: {spec.canary.num_requests} requests, {spec.canary.concurrency} "
            f"streams against {deployed.base_url}"
            + (", replaying the workload the ADR was measured under" if adr.workload else "")
            + "…",
            after=deployed.to_json(), owner=runner, expect=["applying"],
        )  # fmt: skip
        try:
            # An ADR that records the workload it was measured under is judged under it again,
            # before and after the change alike; otherwise the target's canary load.
            result = await self._gate(deployed.base_url, spec.canary, gates, shape=adr.workload)
        except RuleloopError as exc:
            await self._roll_back(
                rem, actuator, before, reason=f"the canary could not run: {exc}", owner=runner,
                expect=["canary"],
            )  # fmt: skip
            return
        numbers = _numbers(result)
        shape = result.report.get("workload_shape")  # what this canary sent, for the draft
        await asyncio.to_thread(
            self.records.add_canary,
            incident_id=rem.incident_id,
            remediation_id=rem.id,
            label=f"{adr.id} on {name}: " + " ".join(f"--{k}={v}" for k, v in rem.change.items()),
            passed=result.passed,
            report=result.report,
        )
        if not result.passed:
            await self._roll_back(
                rem, actuator, before,
                reason="canary failed the gates: " + "; ".join(result.failures),
                numbers=numbers, failures=result.failures, shape=shape, owner=runner,
                expect=["canary"],
            )  # fmt: skip
            return
        await self._step(
            rem.id, "promoting", "remediation.canary_passed", {"numbers": numbers},
            note="canary passed; rolling out…",
            result={"numbers": numbers, "failures": [], "gates": limits,
                    "before_numbers": was or {}, "workload_shape": shape},
            owner=runner, expect=["canary"],
        )  # fmt: skip
        try:
            await actuator.promote(flags)
        except ActuatorError as exc:
            await self._roll_back(
                rem, actuator, before, reason=f"the rollout failed: {exc}", owner=runner,
                expect=["promoting"],
            )  # fmt: skip
            return
        await self._step(
            rem.id, "promoted", "remediation.promoted", {"numbers": numbers, "flags": flags},
            note="kept: the canary met every gate", owner=runner, expect=["promoting"],
        )  # fmt: skip

    async def _baseline(
        self, rem: Remediation, spec: Target, before: Deployed, adr: Adr, runner: str
    ) -> GateRun | None:
        """The same canary on the flags serving now: the matrix's "before" row, and what
        'Nx before' gates multiply. None when it could not run (gates that need it then say
        so when they are resolved)."""
        await self._step(
            rem.id, "approved", "remediation.baseline_started", {"flags": before.flags},
            note="measuring the current flags with the same canary first…",
            owner=runner, expect=["approved"],
        )  # fmt: skip
        try:
            # judged by the absolute gates only: the relative ones multiply what this measures
            assert adr.gates is not None
            result = await self._gate(
                before.base_url, spec.canary, adr.gates.resolve({}, strict=False),
                shape=adr.workload,
            )  # fmt: skip
        except RuleloopError as exc:
            log.warning("baseline canary of remediation %s failed: %s", rem.id, exc)
            return None
        await asyncio.to_thread(
            self.records.add_canary,
            incident_id=rem.incident_id,
            remediation_id=rem.id,
            label="before: " + (_flags_text(before.flags) or "current flags"),
            passed=result.passed,
            report=result.report,
        )
        return result

    async def _roll_back(
        self,
        rem: Remediation,
        actuator: Actuator,
        before: Deployed,
        *,
        reason: str,
        owner: str,
        expect: list[str],
        numbers: dict[str, float | None] | None = None,
        failures: list[str] | None = None,
        shape: dict[str, Any] | None = None,
    ) -> None:
        """Back to the recorded flags, from state ``expect``, as run ``owner``."""
        result = {"numbers": numbers or {}, "failures": failures or [], "reason": reason}
        current = await asyncio.to_thread(self.records.get, rem.id)
        # the resolved limits and the judging canary's workload stay on the record
        for kept in ("gates", "before_numbers", "workload_shape"):
            if kept in current.result:
                result[kept] = current.result[kept]
        if shape is not None:
            result["workload_shape"] = shape
        await self._step(
            rem.id, "rolling_back", "remediation.rolling_back", {"reason": reason},
            note=f"{reason}; rolling back…", result=result, owner=owner, expect=expect,
        )  # fmt: skip
        try:
            if rem.before.get("gateway") is not None:
                name, spec = self.settings.target(rem.target)
                await self._gateway(name, spec).restore(rem.before["gateway"])
            await self._give_context(
                actuator, rem, before, numbers=current.result.get("before_numbers"), reason=reason
            )
            restored = await actuator.rollback(before)
            await verify_serving(restored.base_url)
        except Exception as exc:
            error = (
                str(exc) if isinstance(exc, RuleloopError) else f"unexpected {type(exc).__name__}"
            )
            log.error("rollback of remediation %s failed", rem.id, exc_info=exc)
            await self._step(
                rem.id, "failed", ROLLBACK_FAILED, {"error": error},
                note=f"{reason}; the ROLLBACK FAILED: {error}. Manual action needed: restore "
                f"{_flags_text(before.flags)} on {rem.target}.",
                owner=owner, expect=["rolling_back"],
            )  # fmt: skip
            return
        await self._step(
            rem.id, "rolled_back", "remediation.rolled_back", {"flags": restored.flags},
            note=f"{reason}. Rolled back: {_flags_text(restored.flags)} serve again.",
            owner=owner, expect=["rolling_back"],
        )  # fmt: skip

    async def _crashed(self, remediation_id: int, exc: BaseException, *, owner: str) -> None:
        error_id = new_error_id()
        log.error("remediation %s failed (id %s)", remediation_id, error_id, exc_info=exc)
        text = str(exc) if isinstance(exc, RuleloopError) else f"unexpected error (id {error_id})"
        with contextlib.suppress(Exception):
            await self._step(
                remediation_id, "failed", "remediation.failed", {"error": text},
                note=f"stopped: {text}. Check the target's flags by hand.",
                owner=owner, expect=sorted(ACTIVE),
            )  # fmt: skip

    async def _give_context(
        self,
        actuator: Actuator,
        rem: Remediation,
        before: Deployed,
        *,
        adr_title: str = "",
        numbers: dict[str, float | None] | None = None,
        reason: str = "",
    ) -> None:
        """The change's story for an actuator that records it (a git commit, a pull request)."""
        if not isinstance(actuator, TakesContext):
            return
        link = None
        if rem.channel and rem.ts:
            with contextlib.suppress(Exception):  # only a link: never a reason to stop a change
                link = await self._notifier.permalink(MessageRef(channel=rem.channel, ts=rem.ts))
        give_context(
            actuator, rem, before=before, adr_title=adr_title, link=link, numbers=numbers,
            reason=reason,
        )  # fmt: skip

    def _gateway(self, name: str, spec: Target) -> GatewayAdmin:
        if spec.gateway_url is None or spec.gateway_admin_token_file is None:
            raise UsageError(
                f"the ADR has gateway rules but target {name!r} has no gateway_url and "
                "gateway_admin_token_file to apply them with"
            )
        return GatewayAdmin(url=spec.gateway_url, token_file=spec.gateway_admin_token_file)

    # --- housekeeping (at startup and on a schedule) ----------------------------------------
    async def resume(self, *, stale_s: float | None = None) -> int:
        """Finish what a stopped replica left half done: roll back to the recorded flags.

        Stale means no step or heartbeat for ``stale_s`` (default ``[remediation]
        stale_after_s``) on the database's clock; taking a change over is one conditional
        UPDATE that checks it again, so a run that beat meanwhile keeps its change. A tuning
        session (`ruleloop tune --target`) whose process died is restored the same way
        (``bot.remediation.tuning.restore_stale``). How many were taken over."""
        if stale_s is None:
            stale_s = self.settings.remediation.stale_after_s
        stale = await asyncio.to_thread(self.records.stale, older_than_s=stale_s, states=ACTIVE)
        taken = 0
        for rem in stale:
            runner = replica_id()
            won = await asyncio.to_thread(
                self.records.step,
                rem.id,
                to_state="rolling_back" if rem.state != "approved" else "interrupted",
                action="remediation.resumed",
                detail={"found_in": rem.state, "was_run_by": rem.runner},
                from_states=[rem.state],
                stale_s=stale_s,
                runner=runner,
            )
            if not won:
                continue  # another replica took it, or its run beat again meanwhile
            taken += 1
            if rem.state == "approved":  # nothing was applied yet
                await self._show(
                    rem.id, note="the bot restarted before applying; nothing was changed"
                )
                continue
            name, spec = self.settings.target(rem.target)
            rollback = self._roll_back(
                rem,
                self._actuator_for(name, spec),
                Deployed.from_json(rem.before),
                reason=f"the bot restarted while this change was {rem.state}",
                owner=runner,
                expect=["rolling_back"],
            )
            await self._owned(rem.id, runner, rollback)
        taken += await restore_stale(
            self.settings, self.tuning, actuator_for=self._actuator_for, stale_s=stale_s
        )
        return taken

    async def expire_due(self) -> int:
        """Pending requests whose buttons expired: mark them expired and say so on the card."""
        expired = await asyncio.to_thread(self.records.expired_pending)
        count = 0
        for rem in expired:
            if await asyncio.to_thread(
                self.records.step,
                rem.id,
                to_state="expired",
                action="remediation.expired",
                detail={},
                from_states=["pending"],
            ):
                count += 1
                await self._show(rem.id, note="nobody approved in time; nothing was changed")
        return count

    # --- gates relative to a measurement -------------------------------------------------------
    def _shown_gates(
        self, rem: Remediation, gates: AdrGates | None
    ) -> tuple[dict[str, float], dict[str, str]]:
        """The limits for the card (those the canary used once it ran) and the relative ones."""
        if gates is None:
            return {}, {}
        relative = {key: str(value) for key, value in gates.relative().items()}
        if "gates" in rem.result:
            return dict(rem.result["gates"]), relative
        # until the before-run, a relative gate has no number: the card says what it waits for
        return gates.resolve({}, strict=False).model_dump(exclude_none=True), relative

    # --- showing ---------------------------------------------------------------------------
    async def _step(
        self,
        remediation_id: int,
        state: str,
        action: str,
        detail: dict[str, Any],
        *,
        note: str,
        owner: str,
        expect: list[str],
        **fields: Any,
    ) -> None:
        """Move to ``state`` from one of ``expect`` as run ``owner`` (audited, then shown on
        the card); LostRun, having changed nothing, when the change is not that any more."""
        moved = await asyncio.to_thread(
            self.records.step, remediation_id, to_state=state, action=action,
            detail=detail, from_states=expect, owner=owner, **fields,
        )  # fmt: skip
        if not moved:
            raise LostRun(f"remediation {remediation_id} is no longer run by {owner}")
        await self._show(remediation_id, note=redact(note))  # no URL's credentials on the card

    async def _show(self, remediation_id: int, *, note: str) -> None:
        rem = await asyncio.to_thread(self.records.get, remediation_id)
        if rem.channel is None or rem.ts is None:
            return
        view = await self._view(remediation_id, note=note)
        try:
            await self._notifier.update_remediation(
                MessageRef(channel=rem.channel, ts=rem.ts), view=view
            )
        except RuleloopError:
            log.warning("could not update the card of remediation %s", remediation_id)

    async def _view(
        self, remediation_id: int, *, tokens: dict[str, str] | None = None, note: str = ""
    ) -> RemediationView:
        rem = await asyncio.to_thread(self.records.get, remediation_id)
        subject = f"remediation:{rem.id}"
        if tokens is None:
            tokens = (
                await asyncio.to_thread(self.records.tokens, subject)
                if rem.state == "pending"
                else {}
            )
        adr = await asyncio.to_thread(self._adrs.find, rem.adr_id)
        gates, relative = self._shown_gates(rem, adr[1].gates if adr else None)
        spec = self.settings.targets.get(rem.target)
        return RemediationView(
            id=rem.id,
            adr_id=rem.adr_id,
            adr_title=adr[1].title if adr else "",
            target=rem.target,
            actuator=spec.actuator.kind if spec and spec.actuator else "none",
            requested_by=rem.requested_by,
            state=rem.state,
            diff=diff(rem.before.get("flags", {}), rem.after.get("flags", {})),
            gates=gates,
            relative_gates=relative,
            two_person=rem.approvals_needed > 1,
            approved_by=list(rem.approved_by),
            expires_at=await asyncio.to_thread(self.records.expires_at, subject),
            tokens=tokens,
            note=note,
            gateway=dict(rem.after.get("gateway") or {}),
            numbers=dict(rem.result.get("numbers", {})),
            before_numbers=dict(rem.result.get("before_numbers", {})),
            failures=list(rem.result.get("failures", [])),
        )


def like_for_like(adr_id: str, gates: AdrGates) -> None:
    """Refuse gates that would compare unlike numbers (relative to the engine's normal)."""
    unlike = [unlike_gate(key, value) for key, value in gates.relative(NORMAL).items()]
    if unlike:
        raise UsageError(f"{adr_id}'s gates cannot be checked like for like: " + "; ".join(unlike))


def _numbers(result: GateRun) -> dict[str, float | None]:
    return result.values.four()


def _flags_text(flags: dict[str, Any]) -> str:
    return " ".join(f"--{k}={v}" for k, v in sorted(flags.items())) or "the previous flags"
