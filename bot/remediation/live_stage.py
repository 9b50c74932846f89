"""/apply-adr's live stage: after the canary met the gates, production traffic judges the change.

A target with ``[targets.X.live_stage]`` keeps the change on its canary stage (the canary
Deployment behind the same Service as the baseline, or a second local engine the project's
gateway sends a share of the traffic) for ``steps`` windows of ``step_s``; each
window judges the canary replicas against the baseline replicas on the same live traffic with
the live judge (``bot.canary.live``: a one-sided U test on the engines' histograms and an effect
floor). Each step is a step of the change (audited, on the card). More "roll back" steps than
``failure_limit``, or more "cannot judge" steps than ``inconclusive_limit``, roll the change back
(it is promoted only on evidence); otherwise it is promoted.

A bot stopped mid-stage (kill -9) leaves the change in ``canary`` with the steps it judged on the
record: the next bot that finds it silent goes on from the first step not judged (a window cut
short is judged again, whole), with the canary stage as it was left serving.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from bot.canary import LiveVerdict, analyse
from bot.diagnosis.probes import ProbeContext
from bot.kernel import LiveStage, Target

# (target name, target, stage) -> one window's verdict
LiveJudge = Callable[[str, Target, LiveStage], Awaitable[LiveVerdict]]


def live_judge(context: Callable[[], ProbeContext]) -> LiveJudge:
    """The judge of one step: a window of ``stage.step_s`` over the target's canary and
    baseline replicas, read with a fresh probe context (its clocks and HTTP client)."""

    async def judge(name: str, target: Target, stage: LiveStage) -> LiveVerdict:
        return await analyse(
            name, target, context(), seconds=stage.step_s, interval_s=stage.interval_s
        )

    return judge


async def judge_live(name: str, target: Target, stage: LiveStage) -> LiveVerdict:
    """The judge outside a wired bot: its own HTTP client for the window."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as http:
        return await live_judge(lambda: ProbeContext(http=http))(name, target, stage)


@dataclass
class StageCount:
    """The steps judged so far and what they said: the card's lines, and whether the stage
    has failed (too many "roll back" or "cannot judge")."""

    stage: LiveStage
    lines: list[str] = field(default_factory=list)
    slower: int = 0
    undecided: int = 0

    @classmethod
    def of(cls, stage: LiveStage, lines: list[str]) -> StageCount:
        """The count a record's lines say (a stage a stopped bot left, to go on with)."""
        said = [_decision(line) for line in lines]
        return cls(stage, list(lines), said.count("roll back"), said.count("cannot judge"))

    def add(self, verdict: LiveVerdict) -> None:
        """One step's verdict."""
        n = len(self.lines) + 1
        self.lines.append(f"step {n}/{self.stage.steps}: {verdict.decision}: {_said(verdict)}")
        self.slower += verdict.decision == "roll back"
        self.undecided += verdict.decision == "cannot judge"

    def failed(self) -> str | None:
        """Why the stage rolls the change back now (None: it goes on, or passed)."""
        n = len(self.lines)
        if self.slower > self.stage.failure_limit:
            return (
                f"the live stage found the canary slower than the baseline in {self.slower} of "
                f"{n} steps (allowed: {self.stage.failure_limit}): {self.lines[-1]}"
            )
        if self.undecided > self.stage.inconclusive_limit:
            return (
                f"the live stage could not judge {self.undecided} of {n} steps (allowed: "
                f"{self.stage.inconclusive_limit}): {self.lines[-1]}"
            )
        return None


def _decision(line: str) -> str:
    """A step line's decision: 'step 2/3: roll back: ...' -> 'roll back'."""
    return line.split(": ", 2)[1] if line.count(": ") >= 2 else ""


def _said(verdict: LiveVerdict) -> str:
    """The verdict's reason, with why each metric could not be judged, or the numbers of each
    one found worse ('TTFT: canary p50 ... vs baseline ...; p=0.0001')."""
    unjudged = [f"{m.name}: {m.why}" for m in verdict.metrics if m.why]
    worse = [m.line() for m in verdict.metrics if m.worse]
    detail = unjudged if verdict.decision == "cannot judge" else worse
    return verdict.reason + (f" ({'; '.join(detail)})" if detail else "")
