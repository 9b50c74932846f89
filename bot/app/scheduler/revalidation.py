"""An ADR's gates re-run under production's live workload: what bot/app/scheduler/workload_drift.py
found, and what bot/app/scheduler/messages.py writes of it (its own module so neither imports the
other for it)."""

from __future__ import annotations

from dataclasses import dataclass

from bot.app.scheduler.before_run import BeforeRun
from bot.remediation import GateRun


@dataclass(frozen=True)
class Revalidation:
    """An ADR's gates re-run under the live shape (``result`` None: it sets no gate the canary
    can judge there), which ADR set each gate, each gate not judged, with why
    ('max_tpot_p99_ms 0.5x before: its before was measured ...'), and the before-run its
    'Nx before' gates were resolved against (None: none was asked for)."""

    adr_id: str
    result: GateRun | None
    setters: dict[str, str]
    not_judged: tuple[str, ...] = ()
    before: BeforeRun | None = None

    @property
    def failed(self) -> bool:
        """The gates were run and at least one failed."""
        return self.result is not None and not self.result.passed

    @property
    def failing(self) -> str:
        """'ADR-x: gates fail: TTFT p99 ...' (the thread's title; only when ``failed``)."""
        assert self.result is not None
        return f"{self.adr_id}: gates fail: " + "; ".join(self.result.failures)

    @property
    def summary(self) -> str:
        """'ADR-x: gates hold' / 'ADR-x: gates fail: ...' / 'ADR-x: judged nothing', plus
        '; not judged: ...' for each gate it could not judge under the live shape."""
        unjudged = "; not judged: " + "; ".join(self.not_judged) if self.not_judged else ""
        if self.result is None:
            head = "judged nothing" if self.not_judged else "no gate it can check"
            return f"{self.adr_id}: {head}{unjudged}"
        if self.result.passed:
            held = "the gates judged hold" if self.not_judged else "gates hold"
            return f"{self.adr_id}: {held}{unjudged}"
        return self.failing + unjudged
