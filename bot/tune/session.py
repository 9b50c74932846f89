"""One search: propose a flag set, measure it, score it, tell the search, until it is done.

Where a trial is measured is the ``Measurer``'s business: a fresh local engine per trial
(``bot.tune.runner.LocalMeasurer``), or a production target's canary stage through its
actuator, rolled back after each trial (``bot.tune.on_target``). A ``Journal`` hears of
each trial before it starts and after it ends: the target's session writes both to the store,
so a bot that restarts knows what was running. Every trial's canary JSON is written as soon as
it is measured, into the directory the draft's matrix cites.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bot.adr import format_ms
from bot.canary import Gates
from bot.tune.matrix import TrialRow
from bot.tune.objective import Objective, TrialOutcome, outcome
from bot.tune.plan import Config, TunePlan
from bot.tune.runner import write_row
from bot.tune.search import GridSearch, Search, TpeSearch, TrialProposal
from bot.tune.space import Space, flags_text

Echo = Callable[[str], None]


class Measurer(Protocol):
    """Measures one configuration and says how it went (a row that may say why it failed)."""

    async def measure(self, config: Config, tag: str) -> TrialRow:
        """Serve ``config``, run the canary, put back what served before."""
        ...


class Journal(Protocol):
    """Hears of each trial before it starts and after it ends (the store, for a target)."""

    async def trial_started(self, proposal: TrialProposal, config: Config) -> None:
        """Trial ``proposal.number`` is about to change the engine's flags."""
        ...

    async def trial_ended(
        self, proposal: TrialProposal, row: TrialRow, result: TrialOutcome
    ) -> None:
        """The trial is measured (or failed) and what served before serves again."""
        ...


@dataclass(frozen=True)
class SearchResult:
    """A finished search: one row per measured trial, the pick, the search, its wall time."""

    rows: list[TrialRow]
    pick: TrialRow | None
    search: Search
    wall_s: float


def make_search(plan: TunePlan, space: Space) -> Search:
    """The plan's sampler over ``space``, with its budget and seed."""
    assert plan.objective is not None
    settings = plan.search
    budget = settings.budget(space)
    if settings.sampler == "grid":
        return GridSearch(space, budget=budget)
    return TpeSearch(
        space,
        plan.objective.direction,
        budget=budget,
        seed=settings.seed,
        startup=settings.startup_trials,
    )


async def run_search(
    plan: TunePlan,
    search: Search,
    measurer: Measurer,
    *,
    runs_dir: Path,
    echo: Echo = lambda line: None,
    journal: Journal | None = None,
) -> SearchResult:
    """Measure what the search proposes until it stops; pick the best feasible trial."""
    assert plan.objective is not None
    objective = plan.objective
    gates = plan.trial_gates()
    rows: list[TrialRow] = []
    started = time.perf_counter()
    echo(f"search: {search.space.describe()}; {objective.describe()}; budget {search.budget}")
    while (proposal := search.propose()) is not None:
        config = plan.trial_config(proposal.number, proposal.flags)
        tag = f"[trial {proposal.number}/{search.budget}] {config.name}"
        echo(f"{tag}: {flags_text(proposal.flags, search.space.flags)} ({proposal.how})")
        if journal is not None:
            await journal.trial_started(proposal, config)
        row = await measurer.measure(config, tag)
        result = _score(objective, row, gates)
        row.score = result.value
        row.report_path = str(write_row(runs_dir, proposal.number, config, row))
        search.report(proposal, result)
        rows.append(row)
        if journal is not None:
            await journal.trial_ended(proposal, row, result)
        echo(f"{tag}: {_said(objective, result)}; {_best_so_far(objective, rows)}")
    pick = pick_best(rows, objective)
    return SearchResult(rows=rows, pick=pick, search=search, wall_s=time.perf_counter() - started)


def _score(objective: Objective, row: TrialRow, gates: Gates) -> TrialOutcome:
    if row.values is None or row.report is None:
        return TrialOutcome(failed=f"{row.failed_at or 'canary'}: {row.error or 'not measured'}")
    return outcome(objective, row.report, gates)


def pick_best(rows: list[TrialRow], objective: Objective) -> TrialRow | None:
    """The feasible (every gate met) row with the best objective value, marked recommended;
    the earliest on a tie. None when no trial met the gates."""
    best = _best(rows, objective)
    if best is not None:
        best.recommended = True
    return best


def _best(rows: list[TrialRow], objective: Objective) -> TrialRow | None:
    best: TrialRow | None = None
    for row in rows:
        if not row.passed or row.score is None:
            continue
        if best is None or best.score is None or objective.better(row.score, best.score):
            best = row
    return best


def score_text(objective: Objective, value: float | None) -> str:
    """An objective value as people read it: '12.3 req/s', '412ms'."""
    if value is None:
        return "—"
    if objective.metric.endswith("_ms"):
        return format_ms(value)
    unit = "tok/s" if objective.metric == "output_tokens_per_s" else "req/s"
    return f"{value:,.2f} {unit}"


def _said(objective: Objective, result: TrialOutcome) -> str:
    if result.failed is not None:
        return f"FAILED (never tried again): {result.failed}"
    verdict = "meets the gates" if result.feasible else "misses the gates (infeasible)"
    return f"{objective.metric} {score_text(objective, result.value)}, {verdict}"


def _best_so_far(objective: Objective, rows: list[TrialRow]) -> str:
    best = _best(rows, objective)
    if best is None:
        return "no trial met the gates yet"
    return f"best so far {best.config.name} ({score_text(objective, best.score)})"
