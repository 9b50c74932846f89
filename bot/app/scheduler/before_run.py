"""A drifted rule's before, measured on the live shape: the flags its change replaced, back on
the target's canary stage for one canary run that replays production's live traffic, then what
serves now is put back. They go back exactly as they served (``Actuator.stage``, which restores
the change's record as a rollback does): a flag the change added is removed, not left on
beside the old values, or the before would be a mix of before and after.

'0.5x before' only compares like with like: the before-run of the change that put an ADR in
force was measured under the incident's workload. When production's workload drifts, the
workload-drift job measures a new before under the live shape here, so that the ADR's relative
gates can be judged again, before and after on the same traffic, the same canary, the same
resolution.

It changes the target, so only where the target's config says so
(``[targets.X.canary] drift_before_run = true``: that setting is the approval), and under a
change's rules: it holds the target as a tuning session does (``bot.tune.records``: one change
at a time per target, recorded before the first change, heartbeats), and the flags that served
are restored whatever happens; a bot that dies mid-run leaves a silent session, which the
bot's resume restores (``bot.tune.on_target.SessionRestorer``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from bot.adr import AdrGates, Normal
from bot.adr.workload import WorkloadShape
from bot.canary import Samples
from bot.change import Beat, Holder, TargetBusy, beating, flags_text
from bot.change.actuators import Actuator, ActuatorFactory, Deployed, opened
from bot.kernel import RuleloopError, Target
from bot.kernel.runtime import replica_id
from bot.kernel.store import ChangeKind
from bot.remediation import GateRunner
from bot.tune import RestoreFailed, TuneRecords, finish

log = logging.getLogger("ruleloop.scheduler")
ACTOR = "ruleloop (workload drift)"
APPROVED_BY = "[targets.{target}.canary] drift_before_run"


@dataclass(frozen=True)
class BeforeRun:
    """The numbers of the replaced flags under the live shape, or why there are none."""

    numbers: Normal | None
    flags: str  # the replaced flags, in words ('--max-num-batched-tokens=8192 without --x')
    why: str = ""  # when ``numbers`` is None
    base_url: str = ""  # where it measured: the after-run measures the same engine
    stage: str = "the target"  # 'the canary stage' where the actuator has one
    samples: Samples | None = None  # its per-request values: what 'Nx before' is judged on

    @property
    def ran(self) -> bool:
        """Whether the before-run measured something."""
        return self.numbers is not None


class BeforeRuns:
    """Before-runs on one target's canary stage (its actuator), held like a tuning session."""

    def __init__(
        self,
        *,
        name: str,
        target: Target,
        actuator_for: ActuatorFactory,
        records: TuneRecords,
        gate: GateRunner,
        heartbeat_s: float,
    ) -> None:
        self._name, self._target = name, target
        self._actuator_for, self._records, self._gate = actuator_for, records, gate
        self._heartbeat_s = heartbeat_s

    async def measure(
        self,
        adr_id: str,
        replaced: Deployed,
        live: WorkloadShape,
        ratios: Mapping[str, float] | None = None,
    ) -> BeforeRun:
        """``replaced`` (what served before ``adr_id``'s change) on the canary stage, measured
        by the canary replaying ``live``; the target serves what it served before this returns.
        ``ratios`` (the ADR's 'Nx before' gates) size the run for their two-sample test.
        A refused or failed run is a ``BeforeRun`` saying why; a failed restore raises
        (``RestoreFailed``: the rollback-failed alert counts it)."""
        flags = flags_text(replaced.flags)
        busy = await self._records.in_flight(self._name)
        if busy is not None:
            return BeforeRun(None, flags, _in_flight(busy, self._name))
        try:
            async with opened(self._actuator_for, self._name, self._target) as actuator:
                if not actuator.changes_flags:  # the 'before' would be the fix
                    return BeforeRun(None, flags, "the dry-run actuator changes no flags")
                serving = await actuator.current()
                return await self._held(actuator, adr_id, serving, replaced, live, ratios or {})
        except RestoreFailed:
            raise  # the target may serve the replaced flags: the period fails, the alert counts it
        except RuleloopError as exc:  # no actuator, or it cannot say what serves
            return BeforeRun(None, flags, f"the actuator could not say what serves: {exc}")

    async def _held(
        self,
        actuator: Actuator,
        adr_id: str,
        serving: Deployed,
        replaced: Deployed,
        live: WorkloadShape,
        ratios: Mapping[str, float],
    ) -> BeforeRun:
        """The before-run, held like a tuning session; ``serving`` is restored at its end."""
        flags = _replaced_text(replaced.flags, serving.flags)
        if serving.flags == replaced.flags:
            why = f"{self._name} already serves the flags {adr_id} replaced"
            return BeforeRun(None, flags_text(replaced.flags), why)
        try:
            session = await self._records.begin(
                target=self._name, requested_by=ACTOR,
                approved_by=[APPROVED_BY.format(target=self._name)],
                plan={"drift_before_run": adr_id, "flags": dict(replaced.flags)},
                kind=ChangeKind.DRIFT_BEFORE_RUN,
                before=serving.to_json(), runner=(runner := replica_id()),
                detail={"adr": adr_id, "why": "a before measured under the live shape"},
            )  # fmt: skip
        except TargetBusy as exc:  # it began between our look and our write
            return BeforeRun(None, flags, _in_flight(exc.holder, self._name))
        reason = "the before-run ended"
        try:
            async with beating(
                self._beat(session.id, runner), every_s=self._heartbeat_s,
                name=f"drift before-run {session.id}",
            ):  # fmt: skip
                numbers, samples, stage = await self._run(actuator, replaced, live, ratios)
        except RuleloopError as exc:
            reason = f"the before-run failed: {exc}"
            log.warning("%s: before-run of %s failed: %s", self._name, adr_id, exc)
            return BeforeRun(None, flags, str(exc))
        finally:
            await finish(self._records, session.id, actuator, serving, runner=runner,
                         reason=reason, echo=log.info, rolled_back=False)  # fmt: skip
        where = "the canary stage" if stage != self._target.vllm_url else "the target"
        return BeforeRun(numbers, flags, base_url=stage, stage=where, samples=samples)

    async def _run(
        self,
        actuator: Actuator,
        replaced: Deployed,
        live: WorkloadShape,
        ratios: Mapping[str, float],
    ) -> tuple[Normal, Samples, str]:
        """The before's numbers and per-request values, and the URL they were measured at (the
        canary stage's)."""
        # exactly what served before the change, not its flags set over the change's: a flag
        # the change added is removed (the actuator restores the record as its rollback does)
        deployed = await actuator.stage(replaced)
        # judged by nothing: a before-run only measures what the relative gates compare with,
        # on as many requests as their two-sample test needs (``ratios`` size the run)
        result = await self._gate(
            deployed.base_url, self._target.canary, AdrGates(), shape=live,
            ratios=ratios,
        )  # fmt: skip
        return result.values.numbers(), result.report.samples, deployed.base_url

    def _beat(self, session_id: int, runner: str) -> Beat:
        async def beat() -> bool:
            return await self._records.heartbeat(session_id, runner=runner)

        return beat


def _replaced_text(replaced: Mapping[str, object], serving: Mapping[str, object]) -> str:
    """What the change replaced, in words: the flags that differ from what serves now, and
    those it added ('--max-num-batched-tokens=8192 without --block-size')."""
    words = flags_text({k: v for k, v in replaced.items() if serving.get(k) != v}, none="")
    added = " ".join(f"--{k}" for k in sorted(set(serving) - set(replaced)))
    return " ".join(part for part in (words, added and f"without {added}") if part)


def _in_flight(busy: Holder, target: str) -> str:
    """'change #3 (ADR-x, canary) is in flight on prod-a' / 'tuning session #5 ...'."""
    if busy.kind == "tuning":
        return f"tuning session #{busy.id} is in flight on {target}"
    return f"change #{busy.id} ({busy.adr_id}, {busy.state}) is in flight on {target}"
