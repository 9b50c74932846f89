"""The catalogue: one record per gateable number, the one home of what each is called, how it
is written, which way is worse, which gate limits it, where a canary report, a runbook and an
ADR's matrix keep it, and whether a normal can be taken of it.

Every table of "the four numbers" elsewhere (gates, labels, match readings, matrix columns) is
derived from ``METRICS``; adding a number means adding a record here. A record's unit is its
formatter: ``bot.kernel.numbers.text`` writes every number by it (``show``, ``compact``), and
so this module imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Metric:
    """One number the bot measures, gates and matches."""

    key: str  # the field name everywhere: 'ttft_p99_ms'
    label: str  # at the start of a line: 'TTFT p99', 'Goodput'
    phrase: str  # inside a sentence: 'TTFT p99', 'goodput'
    unit: Literal["ms", "ratio"]
    worse_up: bool  # a bigger number is worse
    gate: str  # the ADR gate that limits it: 'max_ttft_p99_ms'
    report: str  # dotted path in a canary report: 'ttft_ms.p99'
    reading: str  # the runbook reading that gives it: 'vllm_metrics.ttft_p99_ms'
    column: str | None  # its header in an ADR's Metrics Matrix (None: not a matrix column)
    meaning: str  # what it is, in words (adr match's list of metrics)
    normal: bool = True  # a 'Nx normal' can be taken of it (the scheduler's snapshots keep it)
    headline: bool = True  # every surface's row of numbers shows it (Slack, the page, the demo)

    @property
    def gate_kind(self) -> Literal["max", "min"]:
        """'max' for a number that may not grow past its gate, 'min' for one that may not drop."""
        return "max" if self.worse_up else "min"


METRICS: tuple[Metric, ...] = (
    Metric(
        key="ttft_p99_ms",
        label="TTFT p99",
        phrase="TTFT p99",
        unit="ms",
        worse_up=True,
        gate="max_ttft_p99_ms",
        report="ttft_ms.p99",
        reading="vllm_metrics.ttft_p99_ms",
        column="TTFT (P99)",
        meaning="time to first token, p99, client side",
    ),
    Metric(
        key="tpot_p99_ms",
        label="TPOT p99",
        phrase="TPOT p99",
        unit="ms",
        worse_up=True,
        gate="max_tpot_p99_ms",
        report="tpot_ms.p99",
        reading="vllm_metrics.tpot_p99_ms",
        column="TPOT (P99)",
        meaning="time per output token, p99, client side",
    ),
    Metric(
        key="goodput_ratio",
        label="Goodput",
        phrase="goodput",
        unit="ratio",
        worse_up=False,
        gate="min_goodput_ratio",
        report="goodput_ratio",
        reading="vllm_metrics.goodput_ratio",
        column="Goodput",
        meaning="delivered / engine-generated output tokens",
    ),
    Metric(
        key="kv_fragmentation",
        label="KV fragmentation",
        phrase="KV fragmentation",
        unit="ratio",
        worse_up=True,
        gate="max_kv_fragmentation",
        report="kv_fragmentation.observed",
        reading="vllm_metrics.kv_fragmentation",
        column="显存碎片率",
        meaning="KV slots allocated but empty (observed)",
    ),
    Metric(
        key="itl_p99_ms",
        label="ITL p99",
        phrase="ITL p99",
        unit="ms",
        worse_up=True,
        gate="max_itl_p99_ms",
        report="itl_ms.p99",
        reading="vllm_metrics.itl_p99_ms",
        column=None,  # the seed's matrix has five columns; ADR files keep that table
        meaning="gap between streamed tokens, p99",
        headline=False,  # shown where it is gated or matched; the rows keep the seed's four
    ),
)
KEYS = tuple(m.key for m in METRICS)
BY_KEY = {m.key: m for m in METRICS}
BY_GATE = {m.gate: m for m in METRICS}
GATE_OF = {m.key: m.gate for m in METRICS}  # metric -> the gate that limits it
METRIC_OF = {m.gate: m.key for m in METRICS}  # gate -> the metric it limits
NORMAL_KEYS = tuple(m.key for m in METRICS if m.normal)
HEADLINE = tuple(m for m in METRICS if m.headline)  # the row of numbers every surface shows
MATRIX = tuple(m for m in METRICS if m.column)  # an ADR's Metrics Matrix's number columns, in order
