"""The incident flows: what happens after a webhook, a /diagnose or an Apply click.

Each step is written to the audit log before the next one starts. Root-message changes for one
incident are serialized, and every re-render reads the incident's current state from the store,
so a resolution that overtakes a running diagnosis is never painted over.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable

from bot.adr.store import AdrStore
from bot.config import Settings
from bot.diagnosis.metrics import BotMetrics
from bot.diagnosis.models import Diagnosis
from bot.diagnosis.ports import MessageRef, Notifier
from bot.diagnosis.records import IncidentRecords
from bot.diagnosis.service import Diagnoser
from bot.diagnosis.tasks import TaskSupervisor
from bot.errors import NotAllowed, RuleloopError, UsageError
from bot.intake.service import IntakeResult, Outcome
from bot.remediation.policy import who_may
from bot.runbooks.context import TargetRef
from bot.runbooks.types import Finding, Severity
from bot.slack.mrkdwn import escape
from bot.store.db import Database
from bot.store.models import Incident

log = logging.getLogger("ruleloop.flows")


class IncidentFlows:
    """Drives incidents from intake to a posted diagnosis, and answers Slack requests."""

    def __init__(
        self,
        *,
        settings: Settings,
        db: Database,
        notifier: Notifier,
        diagnoser: Diagnoser,
        clock: Callable[[], dt.datetime],
        monotonic: Callable[[], float] = time.monotonic,
        metrics: BotMetrics | None = None,
        tasks: TaskSupervisor | None = None,
        adrs: AdrStore | None = None,
    ) -> None:
        self.settings = settings
        self._adrs = adrs
        self._notifier = notifier
        self._diagnoser = diagnoser
        self._monotonic = monotonic
        self.metrics = metrics or BotMetrics()
        self.tasks = tasks or TaskSupervisor()
        self._records = IncidentRecords(db=db, clock=clock)
        self._locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)

    # --- Alertmanager ---------------------------------------------------------------------
    def after_intake(self, result: IntakeResult, *, received: float) -> None:
        """Start what an intake outcome calls for, in the background."""
        self.metrics.webhooks.labels(result.outcome.value).inc()
        if result.outcome is Outcome.OPENED:
            self.tasks.spawn(
                self.diagnose_incident(result.incident_id, received=received),
                name=f"diagnose-{result.incident_id}",
            )
        elif result.outcome is Outcome.RESOLVED:
            self.tasks.spawn(
                self.show_resolved(result.incident_id), name=f"resolve-{result.incident_id}"
            )

    async def diagnose_incident(
        self, incident_id: int, *, received: float, channel: str | None = None
    ) -> None:
        """Post the root message, run the diagnosis, post it in the thread, update the root."""
        ref = await self._ensure_root(incident_id, state="diagnosing", channel=channel)
        incident = await self._records.load(incident_id)
        try:
            if incident.target is None:
                raise UsageError(self._no_target_advice(incident))
            target = TargetRef(incident.target, self.settings.targets[incident.target])
            diagnosis = await self._diagnoser.diagnose(target, labels=incident.labels)
            diagnosis = await self._with_skipped_adrs(diagnosis)
        except Exception as exc:
            await self._failed(incident_id, ref, exc)
            return
        async with self._locks[incident_id]:
            await self._records.write(
                incident_id,
                "diagnosis.finished",
                detail=diagnosis.summary(),
                summary=diagnosis.summary(),
            )
            await self._notifier.post_diagnosis(ref, diagnosis=diagnosis, incident_id=incident_id)
            await self._notifier.update_root(
                ref, view=await self._records.view(incident_id, "diagnosed")
            )
            latency = self._monotonic() - received - diagnosis.sampling_s
            self.metrics.latency.observe(latency)
            self.metrics.diagnoses.labels("posted").inc()
            await self._records.write(
                incident_id,
                "diagnosis.posted",
                detail={
                    "latency_s": round(latency, 4),
                    "sampling_s": round(diagnosis.sampling_s, 3),
                },
            )
        await self._post_chart(incident_id, ref, diagnosis)

    async def _post_chart(self, incident_id: int, ref: MessageRef, diagnosis: Diagnosis) -> None:
        """The chart follows the numbers: drawing it costs about half a second of CPU."""
        try:
            png = await self._diagnoser.chart(diagnosis)
            if png is None:
                return
            async with self._locks[incident_id]:
                await self._notifier.post_chart(
                    ref,
                    png=png,
                    title=f"{diagnosis.target}: TTFT p99 and queue depth",
                    filename=f"incident-{incident_id}-ttft-queue.png",
                )
                await self._records.write(
                    incident_id, "diagnosis.chart_posted", detail={"bytes": len(png)}
                )
        except RuleloopError as exc:  # advice: what to do (e.g. invite the bot)
            log.warning("chart for incident %s not posted: %s", incident_id, exc)
            await self._notifier.post_reply(
                ref, text=f"The chart could not be posted: {escape(str(exc))}"
            )
        except Exception as exc:
            error_id = uuid.uuid4().hex[:8]
            log.error("chart for incident %s failed (id %s)", incident_id, error_id, exc_info=exc)
            await self._notifier.post_reply(
                ref, text=f"The chart could not be posted (id {error_id})."
            )

    async def show_resolved(self, incident_id: int) -> None:
        """Update the root message to resolved (posting one if the firing was never seen)."""
        async with self._locks[incident_id]:
            incident = await self._records.load(incident_id)
            ref = await self._records.root(incident_id)
            # a diagnosis still running re-renders the root when it ends
            summary = incident.summary or {}
            state = (
                "diagnosed" if summary.get("headline") else
                "failed" if summary.get("failed") else
                "diagnosing" if ref else "waiting"
            )  # fmt: skip
            if ref is None:
                await self._post_root(incident_id, state=state, channel=None)
            else:
                await self._notifier.update_root(
                    ref, view=await self._records.view(incident_id, state)
                )
                await self._records.write(
                    incident_id, "slack.root_updated", detail={"status": "resolved"}
                )

    # --- Slack requests -------------------------------------------------------------------
    def request_diagnosis(self, *, user_id: str, text: str, channel_id: str) -> str:
        """Check a /diagnose request and start it; the returned text acknowledges it."""
        if not self.settings.access.allows("diagnose", user_id):
            raise NotAllowed(
                f"You may not run /diagnose. Allowed: {who_may(self.settings.access.diagnose)}."
            )
        words = text.split()
        if len(words) > 1:
            known = ", ".join(sorted(self.settings.targets))
            raise UsageError(f"Usage: /diagnose [target]. Known targets: {known}")
        name, _ = self.settings.target(words[0] if words else None)
        self.tasks.spawn(
            self.manual(name, user_id=user_id, channel_id=channel_id), name=f"manual-{name}"
        )
        return f"Diagnosing *{name}*: the result will be posted in this channel."

    async def manual(self, name: str, *, user_id: str, channel_id: str) -> None:
        """A /diagnose run: an incident of its own, closed once its diagnosis is posted."""
        received = self._monotonic()
        incident_id = await self._records.open_manual(
            target=name, user_id=user_id, channel_id=channel_id
        )
        await self.diagnose_incident(incident_id, received=received, channel=channel_id)
        await self._records.close(incident_id)

    async def ensure_thread(self, incident_id: int, channel: str | None) -> MessageRef:
        """The incident's thread, posting its root message first when there is none."""
        return await self._ensure_root(incident_id, state="waiting", channel=channel)

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

    async def _failed(self, incident_id: int, ref: MessageRef, exc: BaseException) -> None:
        if isinstance(exc, RuleloopError):  # its text may quote labels, files, error bodies
            text = f"Diagnosis failed: {escape(str(exc))}"
            detail = {"error": str(exc)}
        else:
            error_id = uuid.uuid4().hex[:8]
            log.error(
                "diagnosis of incident %s failed (id %s)", incident_id, error_id, exc_info=exc
            )
            text = (
                f"Diagnosis failed unexpectedly (id {error_id}; the details are in the bot's log)."
            )
            detail = {"error_id": error_id}
        self.metrics.diagnoses.labels("failed").inc()
        async with self._locks[incident_id]:
            await self._records.write(
                incident_id, "diagnosis.failed", detail=detail, summary={"failed": True}
            )
            await self._notifier.post_reply(ref, text=text)
            await self._notifier.update_root(
                ref, view=await self._records.view(incident_id, "failed")
            )

    def _no_target_advice(self, incident: Incident) -> str:
        known = ", ".join(sorted(self.settings.targets)) or "none configured"
        instance = incident.labels.get("instance", "?")
        return (
            f"no configured target matches this alert (instance={instance}); give the alert a "
            f"`ruleloop_target` label or set a target's vllm_url to that host:port. "
            f"Targets: {known}"
        )

    async def _ensure_root(
        self, incident_id: int, *, state: str, channel: str | None
    ) -> MessageRef:
        async with self._locks[incident_id]:
            ref = await self._records.root(incident_id)
            return (
                ref
                if ref is not None
                else await self._post_root(incident_id, state=state, channel=channel)
            )

    async def _post_root(self, incident_id: int, *, state: str, channel: str | None) -> MessageRef:
        view = await self._records.view(incident_id, state)
        channel = channel or self.settings.slack.channel
        ref = await self._notifier.post_root(channel=channel, view=view)
        await self._records.remember_root(incident_id, ref)
        return ref
