"""The baseline canary: a target's canary workload against the gates of the ADRs in force there.

Which ADRs are in force on a target is ``bot.change.in_force``'s to say; the strictest gate
of each number wins (as the diagnosis baseline).

A canary that misses a gate opens an incident (source ``scheduler``, title naming the gates
with the numbers) and posts it like an alert would: root message, diagnosis, then the canary's
numbers in the thread. While that incident is open a drift adds a line to its thread, never a
second incident (its ``open_key`` is unique); a canary that meets the gates again resolves it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.exc import IntegrityError

from bot.adr import GATE_METRICS, NORMAL, Adr, AdrGates, AdrStore, Normal
from bot.app.scheduler import messages
from bot.app.scheduler.runner import JobOutcome
from bot.change import InForce, adrs_in_force
from bot.diagnosis import GATE_OF, Baseline
from bot.incidents import IncidentFlows
from bot.kernel import Target
from bot.kernel.chat import Notifier
from bot.kernel.store import CanaryResult, Database
from bot.kernel.store import service as store
from bot.remediation import GateRun, GateRunner, verdict_lines

SOURCE = "scheduler"
ALERTNAME = "RuleloopBaselineDrift"


def drift_key(target: str) -> str:
    """The open_key of a target's drift incident: one open at a time."""
    return f"baseline-drift:{target}"


def strictest(adrs: Sequence[Adr], before: Normal | None) -> tuple[AdrGates, dict[str, str]]:
    """The strictest gate per number over ``adrs`` ('Nx before' against ``before``), and which
    ADR set each."""
    limits = Baseline.from_adrs(adrs, before).limits
    gates = AdrGates.of_numbers({GATE_OF[key]: limit.value for key, limit in limits.items()})
    return gates, {GATE_OF[key]: limit.adr_id for key, limit in limits.items()}


class BaselineCanary:
    """The baseline job of one target: ``await job(now)`` runs one period."""

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
        notifier: Notifier,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._target = target
        self._listed = list(listed)
        self._db = db
        self._adrs = adrs
        self._gate = gate
        self._flows = flows
        self._notifier = notifier
        self._monotonic = monotonic

    async def __call__(self, now: dt.datetime) -> JobOutcome:
        """Run the canary; open, update or resolve the drift incident."""
        found = await asyncio.to_thread(self.in_force)
        in_force, missing, before = found.adrs, found.missing, found.before
        if not in_force:
            return JobOutcome({"skipped": "no accepted ADR in force here", "missing": missing})
        # Gates written as 'Nx before' are checked against the before-run of the change that put
        # the ADR in force (the same canary); without one they are left out and named in the
        # detail, as are gates relative to normal, which would compare unlike numbers.
        gates, setters = strictest(in_force, before)
        unresolved = _unresolved(in_force, before)
        if gates.is_empty():
            return JobOutcome({"skipped": "the ADRs in force set no gate they can check yet",
                            "adrs": _ids(in_force), "unresolved": unresolved})  # fmt: skip
        # One ADR in force that records its workload is checked under it, as it was measured;
        # several (their shapes differ) share the target's canary load.
        shape = in_force[0].workload if len(in_force) == 1 else None
        result = await self._gate(self._target.vllm_url, self._target.canary, gates, shape=shape)
        detail: dict[str, Any] = {
            "adrs": _ids(in_force),
            "missing": missing,
            "values": result.values.numbers(),
            "failures": result.failures,
            "unresolved": unresolved,
        }
        lines = verdict_lines(result.verdict, setters)
        spec = self._target.canary
        load = messages.load_text(spec.concurrency, spec.num_requests, spec.prompt_length)
        if shape is not None:
            load = f"{spec.num_requests} requests replaying the workload {in_force[0].id} records"
        if result.passed:
            resolved = await asyncio.to_thread(self._resolve, now, detail)
            if resolved is not None:
                await self._flows.show_resolved(resolved)
                text = messages.RECOVERED.format(target=self.name, load=load, lines=lines)
                await self._flows.reply(resolved, text)  # owed: kept while Slack is down
            return JobOutcome(detail | {"resolved": resolved})
        incident_id, opened, posted = await asyncio.to_thread(self._open, now, result, detail)
        if not posted:  # new, or opened by a replica that died before posting it
            await self._flows.diagnose_incident(incident_id, received=self._monotonic())
            text = messages.DRIFT_NUMBERS.format(
                target=self.name, load=load, adrs=", ".join(_ids(in_force)), lines=lines
            )
        else:
            text = messages.still_drifting(now, load, lines)
        await self._flows.reply(incident_id, text)
        return JobOutcome(detail | {"incident": incident_id, "opened": opened})

    def in_force(self) -> InForce:
        """What is in force on this target now."""
        return adrs_in_force(self._db, self._adrs, target=self.name, listed=self._listed)

    def _open(
        self, now: dt.datetime, result: GateRun, detail: dict[str, Any]
    ) -> tuple[int, bool, bool]:
        """The drift incident: its id, whether it was opened now, whether it was posted."""
        key = drift_key(self.name)
        try:
            with self._db.transaction() as s:
                held = store.find_open(s, key=key)
                if held is not None:
                    store.audit(s, at=now, actor="ruleloop", action="baseline.drifting",
                                incident=held, detail=detail)  # fmt: skip
                    return held.id, False, store.root_message(s, held) is not None
                incident = store.create(
                    s,
                    key=key,
                    source=SOURCE,
                    title=messages.drift_title(self.name, result.failures),
                    target=self.name,
                    labels={"alertname": ALERTNAME, "ruleloop_target": self.name,
                            "severity": "warning"},
                    at=now,
                )  # fmt: skip
                s.add(CanaryResult(incident_id=incident.id, remediation_id=None,
                                   label="baseline canary", passed=False,
                                   report=result.report.json_dict(), at=now))  # fmt: skip
                store.audit(s, at=now, actor="ruleloop", action="baseline.drift",
                            incident=incident, detail=detail)  # fmt: skip
                return incident.id, True, False
        except IntegrityError:  # another replica opened it between our read and our write
            with self._db.transaction() as s:
                held = store.find_open(s, key=key)
                assert held is not None
                return held.id, False, True  # the replica that opened it posts it

    def _resolve(self, now: dt.datetime, detail: dict[str, Any]) -> int | None:
        """Close the open drift incident, if any; its id."""
        with self._db.transaction() as s:
            held = store.find_open(s, key=drift_key(self.name))
            if held is None:
                return None
            store.close(s, held, at=now)
            store.audit(s, at=now, actor="ruleloop", action="baseline.recovered",
                        incident=held, detail=detail)  # fmt: skip
            return held.id


def _unresolved(adrs: Sequence[Adr], before: Normal | None) -> list[str]:
    """'ADR-x max_tpot_p99_ms' for each relative gate the canary cannot check: relative to
    normal (unlike numbers), or to a before-run this target has no record of."""
    return [
        f"{adr.id} {key}"
        for adr in adrs
        if adr.gates is not None
        for key, value in adr.gates.relative().items()
        if value.base == NORMAL or value.of(GATE_METRICS[key], before or {}) is None
    ]


def _ids(adrs: Sequence[Adr]) -> list[str]:
    return [adr.id for adr in adrs]
