"""`tune` as one call: measure the plan's configurations (or search its space), pick the best
passing row, write the draft."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from bot.adr import Adr, AdrStore, slugify
from bot.engine import START_TIMEOUT_S, EngineManager
from bot.kernel.runtime import run as run_loop
from bot.tune.draft import build_draft, where_measured
from bot.tune.matrix import TrialRow, recommend
from bot.tune.plan import TunePlan
from bot.tune.runner import Echo, LocalMeasurer, TuneRunner
from bot.tune.search import GridSearch, TpeSearch
from bot.tune.session import SearchResult, make_search, run_search, score_text


@dataclass(frozen=True)
class TuneResult:
    """A finished run: its rows, the recommended one, and the draft written to the store."""

    rows: list[TrialRow]
    pick: TrialRow | None
    draft: Adr
    draft_path: Path
    runs_dir: Path


@dataclass(frozen=True)
class DraftPlace:
    """Where a run's draft and its rows' canary JSON go: the next id of the day, a slug."""

    adr_id: str
    slug: str
    runs_dir: Path

    @classmethod
    def next(cls, store: AdrStore, plan: TunePlan, day: dt.date) -> DraftPlace:
        """The next free id of ``day`` in ``store``, the plan title's slug."""
        adr_id, slug = store.next_id(day), slugify(plan.title)
        return cls(adr_id=adr_id, slug=slug, runs_dir=store.drafts_dir / f"{adr_id}-{slug}.runs")


def run_tune(
    plan: TunePlan,
    *,
    manager: EngineManager,
    store: AdrStore,
    day: dt.date,
    echo: Echo = lambda line: None,
    start_timeout_s: float = START_TIMEOUT_S,
) -> TuneResult:
    """Measure the plan's configurations (or search its space, each trial on a fresh local
    engine) and write a proposed ADR draft into the store."""
    place = DraftPlace.next(store, plan, day)
    runner = TuneRunner(
        plan=plan, manager=manager, runs_dir=place.runs_dir, echo=echo,
        start_timeout_s=start_timeout_s,
    )  # fmt: skip
    if plan.searches:
        search = make_search(plan, plan.search_space())
        result = run_loop(
            run_search(plan, search, LocalMeasurer(runner), runs_dir=place.runs_dir, echo=echo)
        )
        where = "each on a freshly started local engine"
        return write_search_draft(plan, result, store=store, place=place, day=day, where=where)
    rows = runner.run()
    pick = recommend(rows, plan.gates)
    draft = build_draft(
        plan, rows, adr_id=place.adr_id, day=day, runs_dir=place.runs_dir, base=store.drafts_dir
    )
    path = store.write_draft(draft, slug=place.slug)
    return TuneResult(rows=rows, pick=pick, draft=draft, draft_path=path, runs_dir=place.runs_dir)


def write_search_draft(
    plan: TunePlan,
    result: SearchResult,
    *,
    store: AdrStore,
    place: DraftPlace,
    day: dt.date,
    where: str,
) -> TuneResult:
    """The proposed ADR of a finished search: every trial a matrix row, the best feasible
    trial's flags the fix, the gates its release gate. ``where``: how trials were served."""
    draft = build_draft(
        plan, result.rows, adr_id=place.adr_id, day=day, runs_dir=place.runs_dir,
        base=store.drafts_dir, how=search_context(plan, result, where=where),
    )  # fmt: skip
    path = store.write_draft(draft, slug=place.slug)
    return TuneResult(
        rows=result.rows, pick=result.pick, draft=draft, draft_path=path, runs_dir=place.runs_dir
    )


def search_context(plan: TunePlan, result: SearchResult, *, where: str) -> list[str]:
    """The context's account of a search: sampler, space, objective and what the trials gave."""
    assert plan.objective is not None
    search = result.search
    rows = result.rows
    if isinstance(search, TpeSearch):
        sampler = f"Optuna's TPE sampler (seed {search.seed}, {search.startup} random trials first)"
    elif isinstance(search, GridSearch):
        sampler = "the full grid, point by point"
    else:
        sampler = type(search).__name__
    infeasible = sum(1 for r in rows if r.values is not None and r.failures)
    failed = sum(1 for r in rows if r.values is None)
    lines = [
        f"`ruleloop tune` searched {search.space.size} flag sets with {sampler}: it measured "
        f"{len(rows)} of them one after another, {where}, under the same canary workload "
        f"({where_measured()}), in {result.wall_s / 60:.1f} minutes. {infeasible} missed the "
        f"gates and {failed} could not be measured; none was measured twice.",
        "",
        f"- space: {search.space.describe()}",
        f"- objective: {plan.objective.describe()}, among the trials that met every gate",
    ]
    if result.pick is not None:
        lines.append(
            f"- best: {result.pick.config.name} at {score_text(plan.objective, result.pick.score)}"
        )
    if isinstance(search, TpeSearch) and search.duplicates:
        lines.append(
            f"- proposals of flag sets already measured: {search.duplicates}, none measured "
            "again (the untried flag set nearest to each was measured instead)"
        )
    return lines
