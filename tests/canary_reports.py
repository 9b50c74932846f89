"""Canary reports built from per-request latencies, as the canary's own measurement writes them
(no engine page): for the judges that read per-request values (the gate statistics, the
guardrails) without an engine."""

from __future__ import annotations

from collections.abc import Sequence

from bot.canary.client import Outcome, RequestRecord
from bot.canary.report import CanaryMeasurement
from bot.canary.schema import CanaryReport
from bot.canary.verdict import Gates
from tests.workload_pages import chat


def report_of(
    ttft_ms: Sequence[float], tpot_ms: Sequence[float], *, failed: int = 0
) -> CanaryReport:
    """A canary report of requests with these TTFTs and TPOTs (9 tokens each), and ``failed``
    requests that never answered."""
    records = []
    for ttft, tpot in zip(ttft_ms, tpot_ms, strict=True):
        first = ttft / 1000
        r = RequestRecord(sent_at=0.0, first_token_at=first, finished_at=first + 8 * tpot / 1000)
        r.output_tokens, r.outcome = 9, Outcome.OK
        records.append(r)
    for _ in range(failed):
        r = RequestRecord(sent_at=0.0)
        r.outcome, r.error = Outcome.FAILED, "HTTP 500"
        records.append(r)
    return measured(records)


def measured(records: list[RequestRecord]) -> CanaryReport:
    """The report of these request records."""
    return CanaryMeasurement(
        shape=chat(), workload={}, records=records, engine=None, samples=[], gates=Gates(),
        wall_s=10.0, client_cpu_s=0.1,
    ).report()  # fmt: skip
