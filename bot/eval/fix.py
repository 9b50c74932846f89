"""Whether the fix offered for a scenario holds: its ADR's engine flags applied behind its own
gates, judged the way /apply-adr judges a change.

Beside the scenario's own load (its streams, as the incident had them), the same canary runs on
the flags serving now (the before-run), then on the engine restarted with the ADR's fix; the
ADR's gates judge the second run, an 'Nx before' gate two-sample against the first
(``bot.canary``'s statistical judge, at the confidence the ADR names). The fix is kept when every
gate is met, rolled back otherwise; the scenario's truth says which is right.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pydantic import BaseModel, ConfigDict

from bot.adr import BEFORE, Adr
from bot.canary import DEFAULT_LOOKS, Judged, Workload, gates_from, how_sure, measure_async
from bot.eval.scenario import FixSpec


class FixOutcome(BaseModel):
    """What the gate did with the fix, and whether that was right."""

    model_config = ConfigDict(frozen=True)

    adr: str
    flags: dict[str, str]
    kept: bool
    right: bool
    said: str  # the verdict in words: the gates met, or those that failed
    requests: int  # the canary's requests a side


def canary(url: str, spec: FixSpec) -> Workload:
    """The gate's own requests against ``url`` (beside the scenario's load)."""
    return Workload(
        endpoint=f"{url}/v1/completions", concurrency=spec.concurrency,
        num_requests=spec.num_requests, prompt_length=spec.prompt_length,
        output_length=spec.output_length, warmup_requests=min(spec.concurrency, 4),
        timeout_s=900.0,
    )  # fmt: skip


async def judge_fix(
    adr: Adr,
    spec: FixSpec,
    *,
    before_url: str,
    fixed: Callable[[], Awaitable[str]],
    under_load: Callable[[Callable[[], Awaitable[Judged]]], Awaitable[Judged]],
) -> FixOutcome:
    """The before-run on ``before_url``, then ``fixed()`` (the engine restarted with the fix;
    its URL) and the judged run there; each beside the scenario's load (``under_load``)."""
    rule = adr.gates
    assert rule is not None  # validated ADRs carry gates
    ratios = {key: r.factor for key, r in rule.relative(BEFORE).items()}
    absolute = rule.resolve({}, strict=False)

    async def run(url: str, gates: Judged | None) -> Judged:
        limits = absolute
        if gates is not None and ratios:
            limits = rule.resolve({}, before=gates.values.numbers())
        judge = gates_from(limits, ratios=ratios,
                           before=None if gates is None else gates.report.samples,
                           looks=DEFAULT_LOOKS)  # fmt: skip
        return await under_load(lambda: measure_async(
            canary(url, spec), gates=judge, metrics_url=f"{url}/metrics", background=[],
            sample_interval_s=0.5, on_progress=None, progress_interval_s=60.0,
        ))  # fmt: skip

    before = await run(before_url, None)
    after = await run(await fixed(), before)
    kept = after.passed
    said = "; ".join(how_sure(after.report)) or "every gate met" if kept else "; ".join(
        after.failures)  # fmt: skip
    return FixOutcome(
        adr=adr.id, flags={k: str(v) for k, v in adr.fix.engine_args.items()}, kept=kept,
        right=kept == (spec.right == "kept"), said=said, requests=after.report.requests.total,
    )  # fmt: skip
