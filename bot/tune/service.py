"""`tune` as one call: measure every configuration, pick the best passing row, write the draft."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from bot.adr.models import Adr
from bot.adr.store import AdrStore, slugify
from bot.engine.process import START_TIMEOUT_S, EngineManager
from bot.tune.draft import build_draft
from bot.tune.matrix import Row, recommend
from bot.tune.plan import TunePlan
from bot.tune.runner import Echo, TuneRunner


@dataclass(frozen=True)
class TuneResult:
    """A finished run: its rows, the recommended one, and the draft written to the store."""

    rows: list[Row]
    pick: Row | None
    draft: Adr
    draft_path: Path
    runs_dir: Path


def run_tune(
    plan: TunePlan,
    *,
    manager: EngineManager,
    store: AdrStore,
    day: dt.date,
    echo: Echo = lambda line: None,
    start_timeout_s: float = START_TIMEOUT_S,
) -> TuneResult:
    """Measure the plan's configurations and write a proposed ADR draft into the store."""
    adr_id = store.next_id(day)
    slug = slugify(plan.title)
    runs_dir = store.drafts_dir / f"{adr_id}-{slug}.runs"
    runner = TuneRunner(
        plan=plan, manager=manager, runs_dir=runs_dir, echo=echo, start_timeout_s=start_timeout_s
    )
    rows = runner.run()
    pick = recommend(rows, plan.gates)
    draft = build_draft(
        plan, rows, adr_id=adr_id, day=day, runs_dir=runs_dir, base=store.drafts_dir
    )
    path = store.write_draft(draft, slug=slug)
    return TuneResult(rows=rows, pick=pick, draft=draft, draft_path=path, runs_dir=runs_dir)
