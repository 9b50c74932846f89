"""The canary gate after a change: the target's canary workload against the ADR's gates.

The workload comes from the target's ``[targets.X.canary]`` settings (short chats by default;
optional long requests beside them). The verdict is the canary's one judge
(``bot.canary.verdict``), the same that `latency_checker` and `ruleloop tune` print, so what the
thread says and what the drafted ADR says agree.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from bot.adr import AdrGates
from bot.adr.workload import WorkloadShape
from bot.canary import Judged, Progress, Samples, Workload, gates_from, measure_async
from bot.kernel import CanarySpec

GateRun = Judged  # a finished gate canary: its report, the numbers read, the verdict
# (base_url, spec, gates, *, shape=None, ratios=None, before=None)
GateRunner = Callable[..., Awaitable[GateRun]]


def workloads(
    base_url: str, spec: CanarySpec, shape: WorkloadShape | None = None
) -> tuple[Workload, list[tuple[str, Workload]]]:
    """The measured canary and its background load for one target. With ``shape`` the canary
    replays it (lengths, prefixes, arrivals) instead of the target's fixed canary load, and
    sends no background: the shape already holds the long requests production sends; for
    ``spec.replay_s`` seconds at its rate where that is set, else ``spec.num_requests``."""
    endpoint = f"{base_url}/v1/completions"
    if shape is not None:
        replay = Workload(
            endpoint=endpoint,
            concurrency=spec.concurrency,
            num_requests=None if spec.replay_s else spec.num_requests,
            duration_s=spec.replay_s or None,
            shape=shape,
            warmup_requests=min(spec.concurrency, 4),
            timeout_s=spec.timeout_s,
        )
        return replay, []
    canary = Workload(
        endpoint=endpoint,
        concurrency=spec.concurrency,
        num_requests=spec.num_requests,
        prompt_length=spec.prompt_length,
        prefix_length=spec.shared_prefix_length,
        output_length=spec.output_length,
        warmup_requests=min(spec.concurrency, 4),
        timeout_s=spec.timeout_s,
    )
    background = []
    if spec.background_concurrency:
        background.append(
            (
                "long prompts",
                Workload(
                    endpoint=endpoint,
                    concurrency=spec.background_concurrency,
                    num_requests=None,
                    duration_s=spec.timeout_s,
                    prompt_length=spec.background_prompt_length,
                    output_length=spec.background_output_length,
                    seed=1,
                    timeout_s=spec.timeout_s,
                ),
            )
        )
    return canary, background


async def run_gate(
    base_url: str,
    spec: CanarySpec,
    gates: AdrGates,
    *,
    shape: WorkloadShape | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    ratios: Mapping[str, float] | None = None,
    before: Samples | None = None,
) -> GateRun:
    """Run the canary against ``base_url`` (replaying ``shape`` when given) and judge it by
    ``gates``; 'Nx before' ones (``ratios``: gate -> N) two-sample against ``before``, the
    before-run's per-request values (without them, ``ratios`` only size the run)."""
    canary, background = workloads(base_url, spec, shape)
    return await measure_async(
        canary,
        gates=gates_from(gates, ratios=ratios, before=before, looks=spec.looks),
        metrics_url=f"{base_url}/metrics",
        background=background,
        sample_interval_s=0.5,
        on_progress=on_progress,
        progress_interval_s=10.0,
    )
