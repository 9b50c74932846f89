"""Workload drift: production stops sending the traffic an ADR in force was measured under.

Every period the job captures the target's live workload shape from every replica's /metrics
(``bot.probes.workload_capture.capture_fleet``: the fleet's rate, over its replicas) and
compares it (``bot.workload.diff``) with the shape each ADR in force records (its front
matter's ``workload``); read over another number of replicas than the ADR's, the request rates
are compared per replica, so an autoscaler adding replicas is not drift. When one drifted, it
re-runs that ADR's gates with the canary replaying one replica's share of the *live* shape and
posts one thread: what the ADR was measured at, what production sends now, and whether the
gates it could judge hold under it, before any latency alert fires.

Like for like: a gate written 'Nx before' multiplies a before-run measured under the workload
the change was applied under, never under the live shape, so re-validation judges only the
absolute gates and names each relative one as not judged, with why. An ADR whose gates are all
relative is re-validated on nothing, and the thread says so instead of "the gates hold".

One open drift thread per target (its incident's ``open_key``): while it is open, a drifting
period adds nothing; a period whose live shape is alike again closes it. No ADR in force that
records a workload, or a window in which nothing finished, is a skipped period: unknown is not
"alike", so neither opens nor closes a thread.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx
from sqlalchemy.exc import IntegrityError

from bot.adr.models import Adr, AdrGates
from bot.adr.store import AdrStore
from bot.config import Target
from bot.errors import RuleloopError
from bot.incidents.flows import IncidentFlows
from bot.probes.context import resolve_replicas
from bot.probes.exposition import Exposition
from bot.probes.replicas import Replica
from bot.probes.vllm_metrics import MetricsScraper
from bot.probes.workload_capture import CAPTURE_METRICS, capture_fleet
from bot.remediation.gate import GateRunner
from bot.scheduler import messages
from bot.scheduler.baseline import SOURCE, strictest
from bot.scheduler.in_force import adrs_in_force
from bot.scheduler.revalidation import Revalidation
from bot.scheduler.runner import Outcome, json_safe
from bot.store import service as store
from bot.store.db import Database
from bot.workload.describe import context_line
from bot.workload.diff import ShapeDiff, diff
from bot.workload.shape import WorkloadShape, per_replica

ALERTNAME = "RuleloopWorkloadDrift"
ShapeReader = Callable[[str, Target], Awaitable[WorkloadShape]]


def drift_key(target: str) -> str:
    """The open_key of a target's workload-drift thread: one open at a time."""
    return f"workload-drift:{target}"


class LiveShape:
    """Captures a target's live shape from its replicas' /metrics over ``window_s`` seconds."""

    def __init__(
        self,
        *,
        http: httpx.AsyncClient,
        window_s: float,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._http, self._window_s, self._sleep, self._clock = http, window_s, sleep, clock

    async def __call__(self, name: str, target: Target) -> WorkloadShape:
        scrapers = {
            r: MetricsScraper(r.metrics_url, client=self._http, clock=self._clock)
            for r in await resolve_replicas(target)  # a Service's: read when the window starts
        }

        async def scrape(replica: Replica) -> Exposition:
            return await scrapers[replica](only=CAPTURE_METRICS)

        interval = min(5.0, self._window_s / 2)
        return await capture_fleet(
            list(scrapers), scrape, seconds=self._window_s, interval_s=interval,
            sleep=self._sleep, clock=self._clock,
        )  # fmt: skip


class WorkloadDrift:
    """The workload-drift job of one target: ``await job(now)`` runs one period."""

    def __init__(
        self,
        *,
        name: str,
        target: Target,
        listed: Sequence[str],
        db: Database,
        adrs: AdrStore,
        gate: GateRunner,
        flows: IncidentFlows,
        read_shape: ShapeReader,
    ) -> None:
        self.name = name
        self._target = target
        self._listed = list(listed)
        self._db = db
        self._adrs = adrs
        self._gate = gate
        self._flows = flows
        self._read_shape = read_shape

    async def __call__(self, now: dt.datetime) -> Outcome:
        """Capture the live shape; open, keep or close the target's drift thread."""
        found = await asyncio.to_thread(
            adrs_in_force, self._db, self._adrs, target=self.name, listed=self._listed
        )
        measured = [adr for adr in found.adrs if adr.workload is not None]
        if not measured:
            return Outcome({"skipped": "no ADR in force records the workload it was measured "
                            "under", "adrs": found.ids, "missing": found.missing})  # fmt: skip
        try:
            live = await self._read_shape(self.name, self._target)
        except RuleloopError as exc:  # no traffic, engine restarted, /metrics unreachable
            return Outcome({"skipped": f"no live shape this period: {exc}", "adrs": found.ids})
        diffs = {adr.id: diff(_shape(adr), live) for adr in measured}
        drifted = [adr for adr in measured if diffs[adr.id].drifted]
        detail: dict[str, Any] = {
            "adrs": [adr.id for adr in measured],
            "drifted": [adr.id for adr in drifted],
            "dimensions": {i: _drifted_dimensions(d) for i, d in diffs.items()},
            "live": context_line(live),
            "live_source": live.source,  # names a replica that restarted or stopped answering
        }
        if not drifted:
            closed = await asyncio.to_thread(self._close, now, detail)
            if closed is not None:
                await self._flows.show_resolved(closed)
                text = messages.workload_alike(self.name, measured, live)
                await self._flows.reply(closed, text)  # owed: kept while Slack is down
            return Outcome(detail | {"resolved": closed})
        held = await asyncio.to_thread(self._still_open, now, detail)
        if held is not None:
            return Outcome(detail | {"incident": held, "opened": False})
        checks = [await self._revalidate(adr, live) for adr in drifted]
        detail["revalidated"] = [check.summary for check in checks]
        incident_id, opened = await asyncio.to_thread(self._open, now, drifted, checks, detail)
        if opened:
            parts = [messages.workload_drift(self.name, adr, live, diffs[adr.id], check)
                     for adr, check in zip(drifted, checks, strict=True)]  # fmt: skip
            await self._flows.reply(incident_id, "\n\n".join(parts))
        return Outcome(detail | {"incident": incident_id, "opened": opened})

    async def _revalidate(self, adr: Adr, live: WorkloadShape) -> Revalidation:
        """The ADR's absolute gates, by the canary replaying ``live`` on this target.

        Its relative gates are not judged: the one before-run there is (the change that put it
        in force) was measured under another workload than ``live``, and 'Nx before' only
        compares like with like. Without a before, ``strictest`` leaves them out, as for a
        target that never ran the change; ``_not_judged`` names them."""
        gates, setters = strictest([adr], None)
        not_judged = _not_judged(adr, gates)
        if gates.is_empty():
            return Revalidation(adr.id, None, {}, not_judged)
        # The canary replays on one engine: one replica's share of the fleet's traffic.
        replay = per_replica(live)
        result = await self._gate(self._target.vllm_url, self._target.canary, gates, shape=replay)
        return Revalidation(adr.id, result, setters, not_judged)

    def _still_open(self, now: dt.datetime, detail: dict[str, Any]) -> int | None:
        """The open drift thread's incident, noted in the audit log (None: none open)."""
        with self._db.transaction() as s:
            held = store.find_open(s, key=drift_key(self.name))
            if held is None:
                return None
            store.audit(s, at=now, actor="ruleloop", action="workload.drifting",
                        incident=held, detail=json_safe(detail))  # fmt: skip
            return held.id

    def _open(
        self,
        now: dt.datetime,
        drifted: Sequence[Adr],
        checks: Sequence[Revalidation],
        detail: dict[str, Any],
    ) -> tuple[int, bool]:
        """The drift thread's incident: its id, and whether this replica opened it now."""
        key = drift_key(self.name)
        failing = [check.failing for check in checks if check.failed]
        unjudged = [check.adr_id for check in checks if check.result is None and check.not_judged]
        try:
            with self._db.transaction() as s:
                held = store.find_open(s, key=key)
                if held is not None:  # another replica opened it while we re-validated
                    return held.id, False
                incident = store.create(
                    s,
                    key=key,
                    source=SOURCE,
                    title=messages.workload_drift_title(
                        self.name, [adr.id for adr in drifted], failing, unjudged
                    ),
                    target=self.name,
                    labels={"alertname": ALERTNAME, "ruleloop_target": self.name,
                            "severity": "warning" if failing else "info"},
                    at=now,
                )  # fmt: skip
                store.audit(s, at=now, actor="ruleloop", action="workload.drift",
                            incident=incident, detail=json_safe(detail))  # fmt: skip
                return incident.id, True
        except IntegrityError:  # another replica opened it between our read and our write
            with self._db.transaction() as s:
                held = store.find_open(s, key=key)
                assert held is not None
                return held.id, False

    def _close(self, now: dt.datetime, detail: dict[str, Any]) -> int | None:
        """Close the open drift thread's incident, if any; its id."""
        with self._db.transaction() as s:
            held = store.find_open(s, key=drift_key(self.name))
            if held is None:
                return None
            store.close(s, held, at=now)
            store.audit(s, at=now, actor="ruleloop", action="workload.alike",
                        incident=held, detail=json_safe(detail))  # fmt: skip
            return held.id


def _shape(adr: Adr) -> WorkloadShape:
    assert adr.workload is not None
    return adr.workload


def _not_judged(adr: Adr, judged: AdrGates) -> tuple[str, ...]:
    """Each gate of ``adr`` that ``judged`` (its gates resolved without a before) left out:
    'max_tpot_p99_ms 0.5x before: its before was measured under ...'."""
    if adr.gates is None:
        return ()
    return tuple(
        f"{key} {value}: {messages.NOT_JUDGED[value.base]}"
        for key, value in adr.gates.relative().items()
        if getattr(judged, key) is None
    )


def _drifted_dimensions(result: ShapeDiff) -> list[str]:
    return [d.line for d in result.dimensions if d.drifted]
