"""Turns measured canary reports into Metrics Matrix rows, and picks the recommended one.

The values and the verdict of a row come from the canary's one judge (``bot.canary.verdict``),
which also says where each column's number comes from; its ``source_note`` repeats it in
words under the matrix of every draft.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from bot.adr import AdrGates
from bot.canary import PASSED, CanaryReport, Values
from bot.kernel.numbers import catalogue
from bot.tune.plan import BASELINE, Config

RECOMMENDED = "生产推荐配置 (recommended)"
# Why a row has no numbers: vLLM refused the flags, the engine did not start, the canary failed.
FailedAt = Literal["refused", "start", "canary"]
FAILURE_LABELS: dict[str, str] = {
    "refused": "引擎拒绝 (refused by vLLM)",
    "start": "引擎未启动 (engine did not start)",
    "canary": "测量失败 (canary failed)",
}
REASON_LIMIT = 200


@dataclass
class TrialRow:
    """One configuration's outcome: measured values, or why it could not be measured."""

    config: Config
    values: Values | None = None
    error: str | None = None
    failed_at: FailedAt | None = None
    failures: list[str] = field(default_factory=list)
    report: CanaryReport | None = field(default=None, repr=False)
    report_path: str | None = None
    recommended: bool = False
    score: float | None = None  # a search's objective value for this row (None: not a search)

    @property
    def passed(self) -> bool:
        """Measured and within every gate."""
        return self.values is not None and not self.failures

    def verdict(self) -> str:
        """The matrix's 结论 cell."""
        if self.values is None:
            kind = FAILURE_LABELS[self.failed_at or "canary"]
            return f"{kind}: {_short(self.error or 'unknown reason')}"
        if self.failures:
            return f"不达标 (fail: {'; '.join(self.failures)})"
        return RECOMMENDED if self.recommended else PASSED


def _short(text: str) -> str:
    # The log path is in the row's JSON; in the table it is noise.
    text = re.sub(r"\s*\(full log: [^)]*\)\s*$", "", " ".join(text.split()))
    return text if len(text) <= REASON_LIMIT else text[: REASON_LIMIT - 1] + "…"


def recommend(rows: list[TrialRow], gates: AdrGates | None) -> TrialRow | None:
    """The passing row with the most headroom on its tightest gate, or None if none passed.

    Without gates a row is scored against the baseline's TTFT and TPOT p99 instead.
    """
    limits = _limits(rows, gates)
    best: tuple[float, int] | None = None
    pick = None
    for index, row in enumerate(rows):
        if not row.passed or row.values is None:
            continue
        score = (max(_usage(row.values, limits)), index)
        if best is None or score < best:
            best, pick = score, row
    if pick is not None:
        pick.recommended = True
    return pick


def _limits(rows: list[TrialRow], gates: AdrGates | None) -> dict[str, tuple[float, str]]:
    if gates is not None and not gates.is_empty():
        raw = {m.key: (getattr(gates, m.gate), m.gate_kind) for m in catalogue.METRICS}
        # a gate relative to normal has no number here (tune measures no normal)
        return {k: (v, kind) for k, (v, kind) in raw.items() if isinstance(v, float)}
    base = next((r for r in rows if r.config.name == BASELINE and r.values is not None), None)
    if base is None or base.values is None:
        return {}
    latencies = (m.key for m in catalogue.HEADLINE if m.unit == "ms")
    return {k: (v, "max") for k in latencies if (v := getattr(base.values, k))}


def _usage(values: Values, limits: dict[str, tuple[float, str]]) -> list[float]:
    """How close each value is to its limit: 1.0 is at the limit, lower is better."""
    usage = []
    for name, (limit, kind) in limits.items():
        value = getattr(values, name)
        if value is None or limit <= 0:
            continue
        usage.append(
            value / limit if kind == "max" else (limit / value if value > 0 else float("inf"))
        )
    return usage or [0.0]
