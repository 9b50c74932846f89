"""Sends what the outbox holds: an incident's messages in order, each claimed, retried until sent.

``deliver(incident)`` runs right after something is owed (in the task that owed it) and from
the scheduler's ``outbox`` job for whatever is still due. A message goes only after every
earlier one of its incident went, so a thread never starts before its root message; root
messages and updates show the incident as the store has it when they are sent. A transient
failure reschedules the message with exponential backoff (Slack's Retry-After when longer);
a permanent one ends it ``failed`` with the reason: logged, audited, counted
(``ruleloop_slack_deliveries_total{outcome="failed"}``) and on /healthz.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from bot.incidents.records import IncidentRecords
from bot.kernel import EndpointError, Settings
from bot.kernel.chat import Failure, MessageRef, Notifier, classify, escape
from bot.kernel.runtime import BotMetrics, log_ids, span
from bot.kernel.store import Database
from bot.kernel.store import outbox as items
from bot.kernel.store import service as store

log = logging.getLogger("ruleloop.outbox")
CLAIM = dt.timedelta(minutes=5)  # a replica that stops mid-send: another sends it after this


@dataclass
class Round:
    """What one delivery round did."""

    sent: int = 0
    retried: int = 0
    failed: int = 0
    unreachable: bool = False  # Slack itself failed: later messages would meet the same
    root: MessageRef | None = None  # the root message, when this round posted it

    def add(self, other: Round) -> None:
        """Count another round in."""
        self.sent += other.sent
        self.retried += other.retried
        self.failed += other.failed
        self.unreachable = self.unreachable or other.unreachable


class Outbox:
    """Delivers owed messages through the notifier (Slack, or the console)."""

    def __init__(
        self,
        *,
        db: Database,
        notifier: Notifier,
        settings: Settings,
        clock: Callable[[], dt.datetime],
        owner: str,
        metrics: BotMetrics,
        records: IncidentRecords,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._db = db
        self._notifier = notifier
        self._settings = settings
        self._clock = clock
        self._monotonic = monotonic
        self._metrics = metrics
        self._records = records  # the flows', one per process
        self.owner = owner
        self._locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        # when this process received the webhook (or /diagnose) behind a diagnosis: its latency
        self.received: dict[int, float] = {}

    async def deliver(self, incident_id: int, *, force: bool = False) -> Round:
        """Send the incident's due messages in order; stop at the first that cannot go now.

        ``force``: someone waits for the thread (/apply-adr): its root is tried despite backoff.
        """
        with log_ids(incident_id=incident_id), span("slack.deliver") as current:
            done = await self._deliver(incident_id, force=force)  # its lines name the incident
            current.set(sent=done.sent, retried=done.retried, failed=done.failed)
            return done

    async def _deliver(self, incident_id: int, *, force: bool) -> Round:
        done = Round()
        async with self._locks[incident_id]:  # one sender per incident in this process
            while True:
                item = await asyncio.to_thread(self._claim_head, incident_id, force)
                if item is None:
                    return done
                force = False
                try:
                    ref = await self._send(item)
                except Exception as exc:  # every failure is classified: retried or ended
                    failure = classify(exc)
                    if failure.permanent:
                        await asyncio.to_thread(self._fail, item, failure)
                        done.failed += 1
                        continue
                    await asyncio.to_thread(self._retry, item, failure)
                    done.retried += 1
                    done.unreachable = failure.unreachable
                    return done
                await asyncio.to_thread(self._sent, item, ref)
                done.sent += 1
                if item.kind == items.ROOT:
                    done.root = ref

    async def deliver_due(self) -> Round:
        """Deliver every incident with a message due; stop while Slack itself is failing.

        Once Slack takes a message again, the ones waiting out a backoff it caused go in the
        same round, not minutes later.
        """
        total = Round()
        woken = False
        while True:
            for incident_id in await asyncio.to_thread(self._due):
                total.add(await self.deliver(incident_id))
                if total.unreachable:  # one probe per round while Slack is down, not one each
                    return total
            if woken or not total.sent or not await asyncio.to_thread(self._wake):
                return total
            woken = True

    def counts(self) -> dict[str, int]:
        """Messages pending and failed (every replica's)."""
        with self._db.transaction() as s:
            return items.counts(s)

    def prune(self) -> None:
        """Forget old delivered and failed items."""
        with self._db.transaction() as s:
            items.prune(s, now=self._clock())

    # --- one message --------------------------------------------------------------------------
    async def _send(self, item: items.Claimed) -> MessageRef:
        if item.kind == items.ROOT:
            channel = str(item.payload.get("channel") or self._settings.slack.channel)
            view = await self._records.view(item.incident_id)
            return await self._notifier.post_root(channel=channel, view=view)
        thread = await self._records.root(item.incident_id)
        if thread is None:
            raise EndpointError(f"incident {item.incident_id} has no root message to reply under")
        if item.kind == items.UPDATE:
            await self._notifier.update_root(
                thread, view=await self._records.view(item.incident_id)
            )
            return thread
        if item.kind == items.CHART:
            assert item.data is not None
            await self._notifier.post_chart(
                thread,
                png=item.data,
                title=str(item.payload["title"]),
                filename=str(item.payload["filename"]),
            )
            return thread
        return await self._notifier.post_rendered(thread, message=dict(item.payload))

    def _due(self) -> list[int]:
        with self._db.transaction() as s:
            return items.due_incidents(s, now=self._clock())

    def _wake(self) -> int:
        with self._db.transaction() as s:
            return items.wake(s, now=self._clock())

    def _claim_head(self, incident_id: int, force: bool) -> items.Claimed | None:
        with self._db.transaction() as s:
            first = items.head(s, incident_id)
            if first is None:
                return None
            return items.claim(
                s, first.id, owner=self.owner, now=self._clock(), ttl=CLAIM, force=force
            )

    def _sent(self, item: items.Claimed, ref: MessageRef) -> None:
        now = self._clock()
        with self._db.transaction() as s:
            if not items.finish(
                s, item, owner=self.owner, now=now, state=items.SENT, channel=ref.channel, ts=ref.ts
            ):
                log.warning(
                    "incident %s: %s sent after its claim ran out (it may show twice)",
                    item.incident_id,
                    item.kind,
                )
                return
            incident = store.get(s, item.incident_id)
            assert incident is not None
            late = {"attempts": item.attempts} if item.attempts > 1 else {}
            if item.kind == items.ROOT:
                store.add_message(
                    s, incident, kind="root", channel=ref.channel, ts=ref.ts, thread_ts=ref.ts
                )
                store.audit(
                    s,
                    at=now,
                    actor="ruleloop",
                    action="slack.root_posted",
                    incident=incident,
                    detail={"channel": ref.channel, "ts": ref.ts, **late},
                )
            elif item.kind == items.CHART:
                store.audit(
                    s,
                    at=now,
                    actor="ruleloop",
                    action="diagnosis.chart_posted",
                    incident=incident,
                    detail={"bytes": len(item.data or b""), **late},
                )
            elif item.kind == items.UPDATE and "diagnosis" in item.payload:
                sampling = float(item.payload["diagnosis"].get("sampling_s") or 0.0)
                received = self.received.pop(item.incident_id, None)
                latency = (
                    self._monotonic() - received - sampling
                    if received is not None
                    else (now - incident.opened_at).total_seconds() - sampling
                )
                self._metrics.latency.observe(max(latency, 0.0))
                self._metrics.diagnoses.labels("posted").inc()
                log.info("incident %s: diagnosis posted %.2f s after the webhook (sampling "
                         "excluded)", item.incident_id, max(latency, 0.0))  # fmt: skip
                detail = {"latency_s": round(latency, 4), "sampling_s": round(sampling, 3), **late}
                store.audit(
                    s,
                    at=now,
                    actor="ruleloop",
                    action="diagnosis.posted",
                    incident=incident,
                    detail=detail,
                )
        self._metrics.deliveries.labels(item.kind, "sent").inc()
        log.info("incident %s: %s delivered", item.incident_id, item.kind)

    def _retry(self, item: items.Claimed, failure: Failure) -> None:
        now = self._clock()
        config = self._settings.delivery
        if (now - item.created_at).total_seconds() >= config.give_up_after_s:
            hours = config.give_up_after_s / 3600
            self._fail(
                item,
                Failure(
                    True, f"not delivered in {hours:g} h ({item.attempts} tries): {failure.reason}"
                ),
            )
            return
        delay = min(config.retry_max_s, config.retry_first_s * 2 ** (item.attempts - 1))
        delay = max(delay, failure.retry_after_s or 0.0)
        with self._db.transaction() as s:
            items.finish(
                s,
                item,
                owner=self.owner,
                now=now,
                last_error=failure.reason,
                next_at=now + dt.timedelta(seconds=delay),
            )
        self._metrics.deliveries.labels(item.kind, "retried").inc()
        log.warning(
            "incident %s: %s not delivered (try %d), again in %.0f s: %s",
            item.incident_id,
            item.kind,
            item.attempts,
            delay,
            failure.reason,
        )

    def _fail(self, item: items.Claimed, failure: Failure) -> None:
        now = self._clock()
        with self._db.transaction() as s:
            if not items.finish(
                s, item, owner=self.owner, now=now, state=items.FAILED, last_error=failure.reason
            ):
                return
            incident = store.get(s, item.incident_id)
            store.audit(
                s,
                at=now,
                actor="ruleloop",
                action="slack.delivery_failed",
                incident=incident,
                detail={"kind": item.kind, "key": item.key, "error": failure.reason},
            )
            if item.kind == items.ROOT:  # no thread: nothing after it can be posted either
                items.fail_rest(
                    s,
                    item.incident_id,
                    now=now,
                    why=f"the incident's root message was refused: {failure.reason}",
                )
            elif item.kind == items.CHART:  # the thread says why, once
                text = f"The chart could not be posted: {escape(failure.reason)}"
                items.owe(
                    s,
                    item.incident_id,
                    kind=items.REPLY,
                    key="chart:failed",
                    at=now,
                    payload={"text": text},
                )
        self._metrics.deliveries.labels(item.kind, "failed").inc()
        log.error(
            "incident %s: %s not delivered, given up: %s",
            item.incident_id,
            item.kind,
            failure.reason,
        )
