"""Workload drift: production stops sending the traffic an ADR in force was measured under.

Every period the job captures the target's live workload shape from every replica's /metrics
(``bot.diagnosis.probes.workload_capture.capture_fleet``: the fleet's rate, over its replicas) and
compares it (``bot.adr.workload.diff``) with the shape each ADR in force records (its front
matter's ``workload``); read over another number of replicas than the ADR's, the request rates
are compared per replica, so an autoscaler adding replicas is not drift. When one drifted, it
re-runs that ADR's gates with the canary replaying one replica's share of the *live* shape and
posts one thread: what the ADR was measured at, what production sends now, and whether the
gates it could judge hold under it, before any latency alert fires.

Like for like: a gate written 'Nx before' multiplies a before measured under the same workload
as the after. The change's own before-run was measured under the incident's workload, never
under the live shape, so it is not used here. Where the target allows it
(``[targets.X.canary] drift_before_run``), the flags the ADR's change replaced run first on the
canary stage under the live shape (``bot.app.scheduler.before_run``), and the relative gates are
judged against that. Otherwise re-validation judges only the absolute gates and names each
relative one as not judged, with why; an ADR whose gates are all relative is then re-validated
on nothing, and the thread says so instead of "the gates hold".

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

from bot.adr import BEFORE, GATE_METRICS, Adr, AdrGates, AdrStore
from bot.adr.workload import ShapeDiff, WorkloadShape, context_line, per_replica
from bot.adr.workload.diff import diff
from bot.app.scheduler import messages
from bot.app.scheduler.baseline import SOURCE, strictest
from bot.app.scheduler.before_run import BeforeRun, BeforeRuns
from bot.app.scheduler.revalidation import Revalidation
from bot.app.scheduler.runner import JobOutcome, json_safe
from bot.canary import Samples
from bot.change import adrs_in_force
from bot.change.actuators import Deployed
from bot.diagnosis.probes import (
    CAPTURE_METRICS,
    Exposition,
    MetricsScraper,
    Replica,
    capture_fleet,
    resolve_replicas,
)
from bot.incidents import IncidentFlows
from bot.kernel import RuleloopError, Target
from bot.kernel.numbers import BY_GATE
from bot.kernel.store import Database
from bot.kernel.store import service as store
from bot.remediation import GateRunner
from bot.tune import Offer, Retune

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
        before_runs: BeforeRuns | None = None,
        retune: Retune | None = None,
    ) -> None:
        self.name = name
        self._target = target
        self._listed = list(listed)
        self._db = db
        self._adrs = adrs
        self._gate = gate
        self._flows = flows
        self._read_shape = read_shape
        self._before_runs = before_runs  # None: the target does not allow a before-run
        self._retune = retune  # offers the next step for a rule that fails (None: none)

    async def __call__(self, now: dt.datetime) -> JobOutcome:
        """Capture the live shape; open, keep or close the target's drift thread."""
        found = await asyncio.to_thread(
            adrs_in_force, self._db, self._adrs, target=self.name, listed=self._listed
        )
        measured = [adr for adr in found.adrs if adr.workload is not None]
        if not measured:
            return JobOutcome({"skipped": "no ADR in force records the workload it was measured "
                            "under", "adrs": found.ids, "missing": found.missing})  # fmt: skip
        try:
            live = await self._read_shape(self.name, self._target)
        except RuleloopError as exc:  # no traffic, engine restarted, /metrics unreachable
            return JobOutcome({"skipped": f"no live shape this period: {exc}", "adrs": found.ids})
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
            return JobOutcome(detail | {"resolved": closed})
        held = await asyncio.to_thread(self._still_open, now, detail)
        if held is not None:
            return JobOutcome(detail | {"incident": held, "opened": False})
        checks = [await self._revalidate(adr, live, found.replaced) for adr in drifted]
        detail["revalidated"] = [check.summary for check in checks]
        detail["before_runs"] = {
            check.adr_id: messages.before_run_text(check.before)
            for check in checks if check.before is not None
        }  # fmt: skip
        incident_id, opened = await asyncio.to_thread(self._open, now, drifted, checks, detail)
        if opened:
            parts = [messages.workload_drift(self.name, adr, live, diffs[adr.id], check)
                     for adr, check in zip(drifted, checks, strict=True)]  # fmt: skip
            await self._flows.reply(incident_id, "\n\n".join(parts))
            await self._offer_retune(incident_id, drifted, checks, live, found.replaced)
        return JobOutcome(detail | {"incident": incident_id, "opened": opened})

    async def _offer_retune(
        self, incident_id: int, drifted: Sequence[Adr], checks: Sequence[Revalidation],
        live: WorkloadShape, replaced: Deployed | None,
    ) -> None:  # fmt: skip
        """The next step for the first rule whose gates failed on the live shape: a re-tune
        under it (``bot.tune.retune``), offered in the thread or started."""
        failed = [(adr, c) for adr, c in zip(drifted, checks, strict=True) if c.failed]
        if self._retune is None or not failed:
            return
        adr, check = failed[0]
        assert check.result is not None
        before = _judged_against(check.before)
        gates = {g.name: g.limit for g in check.result.report.gates if g.name in GATE_METRICS}
        offer = Offer(
            target=self.name, adr_id=adr.id, fix=dict(adr.fix.engine_args), gates=gates,
            replaced=dict(replaced.flags) if replaced is not None else {}, live=per_replica(live),
            match=list(adr.match), cause=list(adr.cause), replay_s=self._target.canary.replay_s,
            replay_requests=len(before.tpot_ms) if before else self._target.canary.num_requests,
            ratios=_ratios(adr) if before is not None else {}, before=before,
        )  # fmt: skip
        await self._retune.offer(incident_id, offer)

    async def _revalidate(
        self, adr: Adr, live: WorkloadShape, replaced: Deployed | None
    ) -> Revalidation:
        """The ADR's gates, by the canary replaying one replica's share of ``live`` on this
        target (the canary replays on one engine).

        Its 'Nx before' gates are judged against a before measured under the same share of
        ``live`` (``_before``), or not at all: ``strictest`` without a before leaves them out,
        as for a target that never ran the change, and ``_not_judged`` names them, with why."""
        replay = per_replica(live)
        before = await self._before(adr, replay, replaced)
        gates, setters = strictest([adr], before.numbers if before is not None else None)
        not_judged = _not_judged(adr, gates, before)
        if gates.is_empty():
            return Revalidation(adr.id, None, {}, not_judged, before)
        # after a before-run, on the engine it measured (the canary stage, serving the fix again)
        url = before.base_url if before is not None and before.ran else self._target.vllm_url
        ratios = _ratios(adr) if before is not None and before.ran else {}
        result = await self._gate(
            url, self._target.canary, gates, shape=replay, ratios=ratios,
            before=before.samples if before is not None else None,
        )  # fmt: skip
        return Revalidation(adr.id, result, setters, not_judged, before)

    async def _before(
        self, adr: Adr, replay: WorkloadShape, replaced: Deployed | None
    ) -> BeforeRun | None:
        """The flags ``adr``'s change replaced, measured under ``replay`` (None: no gate of it
        needs a before, or the target does not allow a before-run)."""
        if adr.gates is None or not adr.gates.relative(BEFORE) or self._before_runs is None:
            return None
        if replaced is None:
            why = f"no change on {self.name} records which flags {adr.id} replaced"
            return BeforeRun(None, "", why)
        return await self._before_runs.measure(adr.id, replaced, replay, _ratios(adr))

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


def _judged_against(before: BeforeRun | None) -> Samples | None:
    """The before-run's per-request TTFT and TPOT that an offer's 'Nx before' gates were judged
    against (a re-tune's trials are judged the same way); None without a run."""
    if before is None or not before.ran or before.samples is None:
        return None
    return before.samples.model_copy(update={"itl_ms": []})  # the gates read TTFT and TPOT


def _ratios(adr: Adr) -> dict[str, float]:
    """The ADR's 'Nx before' gates: name -> N (judged two-sample against the before-run)."""
    return {} if adr.gates is None else {
        key: r.factor for key, r in adr.gates.relative(BEFORE).items()
    }  # fmt: skip


def _not_judged(adr: Adr, judged: AdrGates, before: BeforeRun | None) -> tuple[str, ...]:
    """Each gate of ``adr`` that ``judged`` left out, with why: 'max_tpot_p99_ms 0.5x before:
    its before was measured under ...' (no before-run), '...: the before-run on the live
    shape did not run: ...', or '...: the before-run measured no TPOT p99'."""
    if adr.gates is None:
        return ()
    return tuple(
        f"{key} {value}: {_why_not(value.base, key, before)}"
        for key, value in adr.gates.relative().items()
        if getattr(judged, key) is None
    )


def _why_not(base: str, gate: str, before: BeforeRun | None) -> str:
    if base != BEFORE or before is None:
        return messages.NOT_JUDGED[base]
    if not before.ran:
        return f"the before-run on the live shape did not run: {before.why}"
    return f"the before-run on the live shape measured no {BY_GATE[gate].phrase}"


def _drifted_dimensions(result: ShapeDiff) -> list[str]:
    return [d.line for d in result.dimensions if d.drifted]
