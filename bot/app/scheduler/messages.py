"""What the scheduled jobs say in Slack, kept together so it can be read and improved as prose."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from bot.adr.workload import PREFIX, context_line
from bot.kernel.numbers import HEADLINE, show
from bot.remediation import verdict_lines

if TYPE_CHECKING:
    from bot.adr import Adr
    from bot.adr.workload import ShapeDiff, WorkloadShape
    from bot.app.scheduler.before_run import BeforeRun
    from bot.app.scheduler.revalidation import Revalidation

DRIFT_TITLE = "Baseline drift on {target}: {failures}"
DRIFT_NUMBERS = (
    ":straight_ruler: *Baseline canary* on *{target}* ({load}) against the gates of the ADRs "
    "in force ({adrs}):\n{lines}\nThe diagnosis above was run because of this drift; when a "
    "later canary meets the gates again, this incident resolves by itself."
)
STILL_DRIFTING = (
    ":straight_ruler: Still drifting at {at:%H:%M} UTC (baseline canary, {load}):\n{lines}"
)
RECOVERED = (
    ":white_check_mark: The baseline canary on *{target}* meets the gates again ({load}):\n{lines}"
)
DRAFT_REMINDER = (
    ":hourglass: *{adr}* has waited {age} for review (`{path}`). Reviewers: {reviewers} — "
    "accept or reject the draft with its buttons in this thread, so the next incident has a rule."
)


def load_text(concurrency: int, num_requests: int, prompt_length: int) -> str:
    """The canary's load in words."""
    return f"{num_requests} requests, {concurrency} at a time, {prompt_length}-token prompts"


def age_text(seconds: float) -> str:
    """'26 h' / '45 min'."""
    return f"{seconds / 3600:.0f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"


def drift_title(target: str, failures: Sequence[str]) -> str:
    """The drift incident's title: which gates drifted, with the numbers."""
    return DRIFT_TITLE.format(target=target, failures="; ".join(failures))


def still_drifting(at: dt.datetime, load: str, lines: str) -> str:
    """A later canary that still misses the gates, in the open incident's thread."""
    return STILL_DRIFTING.format(at=at, load=load, lines=lines)


# --- workload drift -----------------------------------------------------------------------
WORKLOAD_DRIFT_TITLE = "Workload drift on {target}: {adrs} measured on other traffic"
WORKLOAD_DRIFT = (
    ":world_map: *Workload drift on {target}.* *{adr}* was measured at {then}\n"
    "Production now sends {now}\nWhat moved:\n{moved}\n{verdict}"
)
# Why a relative gate is not judged under the live traffic (by its base): like for like only.
NOT_JUDGED = {
    "before": "its before was measured under the incident's workload, not the live one",
    "normal": "normal is the engine's numbers under production, not the canary's",
}
NOTHING_JUDGED = (
    ":warning: Under it nothing was judged: no gate of {adr} can be judged under the live "
    "traffic, so this says nothing of whether {adr} still helps:\n{unjudged}\nTo re-validate "
    "it, run the flags serving before {adr}'s change on the live shape (a before measured under "
    "it: `[targets.NAME.canary] drift_before_run = true`), or add an absolute gate to {adr}."
)
# what 'before' meant for the gates above: the replaced flags, on the same live traffic
BEFORE_ON_LIVE = (
    ":leftwards_arrow_with_hook: 'before' above is {adr}'s before on the same live traffic: "
    "{flags} (the flags its change replaced) on {stage}, then put back: {numbers}"
)
WORKLOAD_ALIKE = (
    ":white_check_mark: *{target}* sends the traffic {adrs} {were} measured under again: {now}"
)


def _traffic(shape: WorkloadShape) -> str:
    """'prompt p50 512 / p99 2,048 tokens, ...' (the Context line without its 'Measured at')."""
    return context_line(shape).removeprefix(PREFIX)


def workload_drift_title(
    target: str, adrs: Sequence[str], failing: Sequence[str], unjudged: Sequence[str] = ()
) -> str:
    """The drift thread's title; which ADRs fail under the live traffic, and which could not be
    re-validated at all (every gate relative), if any."""
    title = WORKLOAD_DRIFT_TITLE.format(target=target, adrs=", ".join(adrs))
    title += f"; under it {'; '.join(failing)}" if failing else ""
    return title + (f"; not re-validated: {', '.join(unjudged)}" if unjudged else "")


def revalidation_text(adr: Adr, check: Revalidation) -> str:
    """The re-validated gates under the live traffic: each judged gate with its mark, then each
    gate not judged, with why. Never 'hold' for a gate that was not judged."""
    unjudged = "\n".join(f":heavy_minus_sign: Not judged: {line}" for line in check.not_judged)
    result = check.result
    if result is None:
        if not check.not_judged:
            return f"{adr.id} sets no gate the canary can check, so it was not re-validated."
        return NOTHING_JUDGED.format(adr=adr.id, unjudged=unjudged)
    if not result.passed:
        head = ":x: Under it the gates fail"
    elif check.not_judged:
        head = ":white_check_mark: Under it the gates judged hold"
    else:
        head = ":white_check_mark: Under it the gates still hold"
    lines = verdict_lines(result.verdict, check.setters)
    text = f"{head} (the canary replayed the live traffic):\n{lines}"
    if check.before is not None and check.before.numbers is not None:
        text += "\n" + BEFORE_ON_LIVE.format(
            adr=adr.id,
            flags=check.before.flags,
            stage=check.before.stage,
            numbers=_numbers(check.before.numbers),
        )
    return text + (f"\n{unjudged}" if unjudged else "")


def before_run_text(before: BeforeRun) -> str:
    """'--max-num-batched-tokens=8192 on the target: TTFT p99 27.3 ms, TPOT p99 2.9 ms, ...',
    or why it did not run."""
    if before.numbers is None:
        return f"did not run: {before.why}"
    return f"{before.flags} on {before.stage}: {_numbers(before.numbers)}"


def _numbers(numbers: Mapping[str, float | None]) -> str:
    """'TTFT p99 1,710 ms, TPOT p99 41.3 ms, ...': the headline numbers measured."""
    return ", ".join(
        f"{m.label} {show(m.key, numbers.get(m.key))}" for m in HEADLINE if m.key in numbers
    )


def workload_drift(
    target: str, adr: Adr, live: WorkloadShape, moved: ShapeDiff, check: Revalidation
) -> str:
    """One ADR's part of the drift thread: then, now, what moved, the re-validated gates."""
    assert adr.workload is not None
    return WORKLOAD_DRIFT.format(
        target=target,
        adr=adr.id,
        then=context_line(adr.workload).removeprefix(PREFIX),
        now=_traffic(live),
        moved="\n".join(f"• {d.line}" for d in moved.dimensions if d.drifted),
        verdict=revalidation_text(adr, check),
    )


def workload_alike(target: str, adrs: Sequence[Adr], live: WorkloadShape) -> str:
    """The drift thread's last line: production looks like the measured traffic again."""
    ids = ", ".join(adr.id for adr in adrs)
    return WORKLOAD_ALIKE.format(
        target=target, adrs=ids, were="was" if len(adrs) == 1 else "were", now=_traffic(live)
    )
