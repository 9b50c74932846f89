"""The incident flows: what happens after a webhook, a /diagnose or an Apply click.

Each step is written to the audit log before the next one starts. Every message an incident is
owed goes through the outbox (``bot.incidents.outbox``): stored first, then delivered in order,
and sent again until Slack takes it, so Slack being down loses nothing; the diagnosis itself runs at
once, Slack or not. Root messages show the incident as the store has it when they are sent, so
a resolution that overtakes a running diagnosis is never painted over.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable

from bot.adr import AdrStore
from bot.diagnosis import Diagnoser, Diagnosis
from bot.diagnosis.probes import Finding, Severity, TargetRef
from bot.incidents.intake.service import IntakeOutcome, IntakeResult
from bot.incidents.outbox import Outbox
from bot.incidents.records import ButtonsOf, IncidentRecords
from bot.kernel import EndpointError, NotAllowed, RuleloopError, Settings, UsageError
from bot.kernel.chat import (
    ACKNOWLEDGE,
    CAUSE_CONFIRMED,
    CAUSE_WRONG,
    SILENCE,
    MessageRef,
    Notifier,
    escape,
)
from bot.kernel.runtime import (
    BotMetrics,
    TaskSupervisor,
    about_incident,
    annotate,
    new_error_id,
    replica_id,
    traced,
    who_may,
)
from bot.kernel.store import Database, DiagnosisSummary, Incident
from bot.kernel.store import outbox as items

log = logging.getLogger("ruleloop.flows")


DIAGNOSIS_CLAIM_S = 900.0  # a diagnosis whose replica stopped is run again after this
DIAGNOSIS, DELIVERY = "diagnosis", "delivery"  # the bounded groups of background work
SWEEP_BUDGET_S = 10.0  # how long one outbox run goes on starting owed diagnoses as others end
REDIAGNOSE_AFTER = dt.timedelta(minutes=1)  # the task that owed a diagnosis runs it before


class IncidentFlows:
    """Drives incidents from intake (or a /diagnose) to a posted diagnosis, and gives the other
    services an incident's thread (``ensure_thread``); every message goes through the outbox.
    The bot's tasks and metrics are injected (``bot.app.server``), not owned here."""

    def __init__(
        self,
        *,
        settings: Settings,
        db: Database,
        notifier: Notifier,
        diagnoser: Diagnoser,
        clock: Callable[[], dt.datetime],
        metrics: BotMetrics,
        tasks: TaskSupervisor,
        monotonic: Callable[[], float] = time.monotonic,
        adrs: AdrStore | None = None,
        owner: str | None = None,
    ) -> None:
        self.settings = settings
        self._adrs = adrs
        self._notifier = notifier
        self._diagnoser = diagnoser
        self._clock = clock
        self._monotonic = monotonic
        self._metrics = metrics  # the bot's, shared with the endpoints and the outbox
        self._tasks = tasks  # the bot's supervisor, drained when it stops
        self.owner = owner or replica_id()
        self._records = IncidentRecords(db=db, clock=clock)
        self.outbox = Outbox(
            db=db, notifier=notifier, settings=settings, clock=clock, owner=self.owner,
            metrics=metrics, records=self._records, monotonic=monotonic,
        )  # fmt: skip

    # --- Alertmanager ---------------------------------------------------------------------
    def after_intake(self, result: IntakeResult, *, received: float) -> None:
        """Start what an intake outcome calls for, in the background."""
        self._metrics.webhooks.labels(result.outcome.value).inc()
        incident_id = result.incident_id
        server = self.settings.server
        # bounded: past the limit the work stays owed in the store and the outbox job (sweep)
        # does it later, at its own pace, so a flood of notifications cannot multiply tasks
        if result.outcome is IntakeOutcome.OPENED:
            self._tasks.try_spawn(self.drive(incident_id, received=received),
                                  name=f"diagnose-{incident_id}", group=DIAGNOSIS,
                                  limit=server.max_diagnoses)  # fmt: skip
        elif result.outcome in (IntakeOutcome.RESOLVED, IntakeOutcome.UPDATED) or result.owed:
            # an alert that joined or resolved has its thread line (bot.incidents.intake.service); a
            # repeat of an incident Slack never got is the moment to try it again
            self._tasks.try_spawn(self.drive(incident_id), name=f"deliver-{incident_id}",
                                  group=DELIVERY, limit=server.max_deliveries)  # fmt: skip

    @about_incident  # its log lines name the incident
    async def drive(self, incident_id: int, *, received: float | None = None) -> None:
        """Deliver what the incident is owed; with ``received`` (it was just opened or asked
        for), run its diagnosis too, when one is owed and no one runs it. The root message goes
        first: on-call sees the incident while its window is sampled, before the numbers."""
        await self.outbox.deliver(incident_id)
        # a repeat or a resolution delivers only: a diagnosis a stopped process left is the
        # outbox job's, and never after the alert resolved
        if received is not None and await self._records.claim_diagnosis(
            incident_id, owner=self.owner, ttl_s=DIAGNOSIS_CLAIM_S
        ):
            await self._diagnose(incident_id, received=received)

    async def diagnose_incident(
        self, incident_id: int, *, received: float, channel: str | None = None
    ) -> None:
        """Owe the incident its root message and a diagnosis (once each), then drive it."""
        await self._records.owe_diagnosis(incident_id, channel=channel)
        await self.drive(incident_id, received=received)

    async def sweep(self, *, budget_s: float = SWEEP_BUDGET_S) -> dict[str, object]:
        """The outbox job: deliver what is due, and run the diagnoses nobody is running, at
        most ``max_diagnoses`` at once: for ``budget_s`` it starts the next as one ends."""
        done = await self.outbox.deliver_due()
        rediagnosed = []
        due = await self._records.due_diagnoses(older_than=REDIAGNOSE_AFTER)
        ends = self._monotonic() + budget_s
        limit = self.settings.server.max_diagnoses
        for incident_id in due:
            wait_s = max(0.0, ends - self._monotonic())
            if not await self._tasks.room(DIAGNOSIS, limit, timeout_s=wait_s):
                break  # the rest stay owed for the next run
            if await self._records.claim_diagnosis(
                incident_id, owner=self.owner, ttl_s=DIAGNOSIS_CLAIM_S
            ):
                rediagnosed.append(incident_id)
                # claimed: a shed now would leave the claim blocking it for DIAGNOSIS_CLAIM_S
                self._tasks.try_spawn(self._diagnose(incident_id, received=None),
                                      name=f"rediagnose-{incident_id}", group=DIAGNOSIS,
                                      limit=limit, claimed=True)  # fmt: skip
        await asyncio.to_thread(self.outbox.prune)
        left = await asyncio.to_thread(self.outbox.counts)
        return {"sent": done.sent, "retried": done.retried, "failed": done.failed,
                "slack_failing": done.unreachable, "rediagnosed": rediagnosed, **left}  # fmt: skip

    @about_incident
    @traced("diagnosis")  # in the trace of the webhook that opened the incident, if one did
    async def _diagnose(self, incident_id: int, *, received: float | None) -> None:
        """Run the owed diagnosis; keep it and owe its messages in one step; deliver them."""
        if received is not None:
            self.outbox.received[incident_id] = received
        incident = await self._records.load(incident_id)
        try:
            if incident.target is None:
                raise UsageError(self._no_target_advice(incident))
            target = TargetRef(incident.target, self.settings.targets[incident.target])
            diagnosis = await self._diagnoser.diagnose(
                target, labels=incident.labels,
                alert_start=await self._records.alert_start(incident_id),
            )  # fmt: skip
            diagnosis = await self._with_skipped_adrs(diagnosis)
        except Exception as exc:
            annotate(target=incident.target, error=type(exc).__name__)
            await self._failed(incident_id, exc)
            return
        supported = [c.cause for c in diagnosis.causes if c.verdict == "supported"]
        annotate(target=diagnosis.target, runbook=diagnosis.runbook,
                 cause=supported[0] if supported else None)  # fmt: skip
        summary = diagnosis.summary()
        messages = self._notifier.render_diagnosis(diagnosis, incident_id=incident_id)
        remembered = await self._remember(incident_id, summary)
        if remembered is not None:  # after the findings: has this cause happened here before
            messages.insert(1, {"text": remembered})
        kept = await self._records.diagnosed(
            incident_id,
            action="diagnosis.finished",
            detail=summary.json_dict(),
            summary=summary,
            messages=messages,
            update={"diagnosis": {"sampling_s": diagnosis.sampling_s}},
            buttons_of=self._buttons_of(),
        )
        if not kept:  # a replica that took the diagnosis over finished it first
            log.warning("incident %s: another replica's diagnosis was kept", incident_id)
            return
        await self._owe_chart(incident_id, diagnosis)
        # one delivery for what the diagnosis owes (the root went before the window was sampled)
        await self.outbox.deliver(incident_id)

    async def _owe_chart(self, incident_id: int, diagnosis: Diagnosis) -> None:
        """Owe the chart, after the numbers in the thread (or a line saying it failed)."""
        try:
            png = await self._diagnoser.chart(diagnosis)
        except Exception as exc:
            error_id = new_error_id()
            log.error("chart for incident %s failed (id %s)", incident_id, error_id, exc_info=exc)
            text = f"The chart could not be drawn (id {error_id})."
            await self._records.owe(incident_id, kind=items.REPLY, key="chart:failed",
                                    payload={"text": text})  # fmt: skip
        else:
            if png is None or diagnosis.chart is None:
                return
            await self._records.owe(
                incident_id, kind=items.CHART, key=items.CHART, data=png,
                payload={"title": diagnosis.chart.title,
                         "filename": f"incident-{incident_id}-{diagnosis.chart.slug}-queue.png"},
            )  # fmt: skip

    async def show_resolved(self, incident_id: int) -> None:
        """Show the incident resolved: an update of its root (the root, if none was owed)."""
        await self._records.owe_root_change(incident_id)
        await self.outbox.deliver(incident_id)

    async def reply(self, incident_id: int, text: str) -> None:
        """One message (mrkdwn) in the incident's thread, owed first so Slack may be down."""
        await self._records.owe(incident_id, kind=items.REPLY, payload={"text": text})
        await self.outbox.deliver(incident_id)

    # --- Slack requests -------------------------------------------------------------------
    def request_diagnosis(self, *, user_id: str, target: str | None, channel_id: str) -> str:
        """Check who asks and for which target, and start it; the returned text acknowledges it
        (``target`` None: the only one configured)."""
        if not self.settings.access.allows("diagnose", user_id):
            raise NotAllowed(
                f"You may not run /diagnose. Allowed: {who_may(self.settings.access.diagnose)}."
            )
        name, _ = self.settings.target(target)
        self._tasks.spawn(
            self.manual(name, user_id=user_id, channel_id=channel_id), name=f"manual-{name}"
        )
        return f"Diagnosing *{name}*: the result will be posted in this channel."

    async def manual(self, name: str, *, user_id: str, channel_id: str) -> None:
        """A /diagnose run: an incident of its own, closed once its diagnosis is done."""
        received = self._monotonic()
        incident_id = await self._records.open_manual(
            target=name, user_id=user_id, channel_id=channel_id
        )
        await self.drive(incident_id, received=received)
        await self._records.close(incident_id)

    async def ensure_thread(self, incident_id: int, channel: str | None) -> MessageRef:
        """The incident's thread, posting its root message now when it has none yet.

        EndpointError when Slack does not take it now (the root stays owed and is retried).
        """
        ref = await self._records.root(incident_id)
        if ref is not None:
            return ref
        await self._records.owe(incident_id, root_channel=channel)
        # someone is waiting: no backoff; posted by another replica meanwhile: read it
        ref = (await self.outbox.deliver(incident_id, force=True)).root
        ref = ref or await self._records.root(incident_id)
        if ref is None:
            why = await self._records.owed_error(incident_id, items.ROOT)
            raise EndpointError(
                "the incident's Slack thread could not be posted now"
                + (f" ({why})" if why else "")
                + "; the bot keeps trying. Ask again in a minute."
            )
        return ref

    # --- helpers ----------------------------------------------------------------------------
    async def _with_skipped_adrs(self, diagnosis: Diagnosis) -> Diagnosis:
        """The diagnosis with a line per ADR file that did not parse (it matched without them)."""
        if self._adrs is None:
            return diagnosis
        skipped = await asyncio.to_thread(self._adrs.skipped)
        notes = [
            Finding(Severity.WARNING, f"skipped ADR file {path.name}: {why}", source="adr store")
            for path, why in skipped
        ]
        return dataclasses.replace(diagnosis, findings=[*diagnosis.findings, *notes])

    async def _remember(self, incident_id: int, summary: DiagnosisSummary) -> str | None:
        """What the store remembers of the supported causes here; a failed read costs the
        line, never the diagnosis (the log has why)."""
        try:
            return await self._records.remember(incident_id, summary)
        except Exception:
            log.warning("incident %s: earlier incidents not read", incident_id, exc_info=True)
            return None

    async def _failed(self, incident_id: int, exc: BaseException) -> None:
        if isinstance(exc, RuleloopError):  # its text may quote labels, files, error bodies
            text = f"Diagnosis failed: {escape(str(exc))}"
            detail: dict[str, object] = {"error": str(exc)}
        else:
            error_id = new_error_id()
            log.error(
                "diagnosis of incident %s failed (id %s)", incident_id, error_id, exc_info=exc
            )
            text = (
                f"Diagnosis failed unexpectedly (id {error_id}; the details are in the bot's log)."
            )
            detail = {"error_id": error_id}
        self._metrics.diagnoses.labels("failed").inc()
        kept = await self._records.diagnosed(
            incident_id, action="diagnosis.failed", detail=detail,
            summary=DiagnosisSummary(failed=True), messages=[{"text": text}], update={},
            buttons_of=self._buttons_of(),
        )  # fmt: skip
        if kept:
            await self.outbox.deliver(incident_id)

    def _buttons_of(self) -> ButtonsOf:
        """The thread's buttons after the diagnosis: Acknowledge on an alerted incident, and
        Silence too where its target has ``[targets.X.silence]`` (a /diagnose run gets none);
        Cause confirmed / Wrong cause on any diagnosis that supports a cause."""

        def kinds(incident: Incident) -> list[str]:
            feedback = [CAUSE_CONFIRMED, CAUSE_WRONG] if incident.summary.supported() else []
            if incident.source == "slash":
                return feedback
            target = self.settings.targets.get(incident.target or "")
            silence = [SILENCE] if target is not None and target.silence is not None else []
            return [*silence, ACKNOWLEDGE, *feedback]

        return kinds, lambda tokens: self._notifier.render_thread_buttons(tokens)

    def _no_target_advice(self, incident: Incident) -> str:
        known = ", ".join(sorted(self.settings.targets)) or "none configured"
        instance = incident.labels.get("instance", "?")
        return (
            f"no configured target matches this alert (instance={instance}); give the alert a "
            f"`ruleloop_target` label or set a target's vllm_url to that host:port. "
            f"Targets: {known}"
        )
