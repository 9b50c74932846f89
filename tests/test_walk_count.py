"""The /apply-adr walk stays short (issue 40): bench/walk_count.py's one change (the real bot,
Slack and Kubernetes faked at the wire) opens at most 25 store transactions, reads the change's
row at most 6 times (a write returns what it wrote: UPDATE ... RETURNING), renders the card once
per state change and reads the ADR store twice. A change that makes the walk longer fails here
with the figures, so it is a decision, not a drift. Counts, not timings: the same on every
machine."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).parent.parent
# was 54 transactions, 25 reads of the change's row and 7 renders before issue 40
MOST = {"transactions": 25, "change_reads": 6, "card_renders": 6, "adr_reads": 2}
# pending, approved, applying, canary, promoting, promoted: one render each
STATES = 6


def walk_count() -> ModuleType:
    spec = importlib.util.spec_from_file_location("walk_count", ROOT / "bench" / "walk_count.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["walk_count"] = module
    spec.loader.exec_module(module)
    return module


async def test_the_apply_adr_walk_is_no_longer_than_its_figures(tmp_path: Path) -> None:
    bench = walk_count()
    walk = bench.Walk()
    state = await bench.one_change(walk, tmp_path)
    assert state == "promoted, 1 draft"
    found = walk.summary()
    longer = {k: (found[k], most) for k, most in MOST.items() if found[k] > most}
    assert not longer, f"the /apply-adr walk grew (found, most): {longer}"
    assert found["card_renders"] == STATES  # once per state change, not once per read
    assert found["transactions"] > 10 and found["change_reads"] >= 1  # the counters count
