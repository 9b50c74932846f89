"""The post-incident draft records the workload shape of the canary that judged the change.

The bot is the real one (create_bot, the store, the console transport); the gate canary and the
actuator are the two seams the bot takes in its constructor, replaced here by ones that record
what they were given. The gate canary's report says which shape it sent, as a canary's JSON
report does (``workload_shape``); the before-run sends another one, so a draft that took the
wrong run's shape fails here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from bot.adr.models import AdrGates
from bot.adr.parse import parse
from bot.adr.render import render
from bot.adr.shared import SharedAdrStore
from bot.adr.workload.describe import context_line
from bot.adr.workload.shape import WorkloadShape
from bot.canary.verdict import gates_from, judged
from bot.kernel.config import CanarySpec
from bot.kernel.store.models import AdrDraft, Remediation
from bot.remediation.gate import GateRun
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import FakeSlack
from tests.test_adr_relative_flow import ADR, RELATIVE_ADR, MemoryActuator
from tests.workload_pages import chat, long_system_prompt

# The relative-gate test's ADR, its match an absolute number (this bot has no normal yet).
CHUNKING_ADR = RELATIVE_ADR.replace("value: 3x normal", "value: 50.0")
assert CHUNKING_ADR != RELATIVE_ADR
BEFORE_SHAPE, JUDGING_SHAPE = chat(), long_system_prompt()


class ShapedCanary:
    """The gate's canary without an engine: one report per run (the before-run first), each
    with its TPOT p99 and the workload shape it says it sent."""

    def __init__(self) -> None:
        self.runs: list[tuple[float, WorkloadShape | None]] = [
            (60.0, BEFORE_SHAPE),
            (21.5, JUDGING_SHAPE),
        ]
        self.calls = 0
        self.replayed: list[object] = []  # the shape each run was asked to replay

    async def __call__(
        self, base_url: str, spec: CanarySpec, gates: AdrGates, *, shape: object = None,
        **judging: object,
    ) -> GateRun:
        self.replayed.append(shape)
        tpot, shape = self.runs[self.calls]
        self.calls += 1
        report: dict[str, Any] = {
            "ttft_ms": {"p99": 180.0}, "tpot_ms": {"p99": tpot}, "goodput_ratio": 0.99,
            "kv_fragmentation": {"observed": 0.12}, "requests": {"total": 32, "failed": 0},
        }  # fmt: skip
        if shape is not None:
            report["workload_shape"] = shape.model_dump(mode="json")
        return judged(report, gates_from(gates))


@pytest.fixture
def canary() -> ShapedCanary:
    return ShapedCanary()


@pytest.fixture
async def h(tmp_path: Path, slack: FakeSlack, canary: ShapedCanary) -> AsyncIterator[Harness]:
    h = harness(tmp_path, slack=slack, bot_options={"gate": canary, "actuator_for": MemoryActuator})
    (tmp_path / "adr" / f"{ADR}-chunk-long-prefills.md").write_text(CHUNKING_ADR)
    yield h
    await h.close()


async def _apply(h: Harness) -> tuple[Remediation, str]:
    """Request the ADR on prod-a, approve it, let it run; the remediation and the draft's text
    (the one the change ended with, else the one `/adr-draft` writes)."""
    await h.bot.remediation.request(user_id="U1", adr_id=ADR, target="prod-a")
    done = await h.approve_change()
    with h.bot.db.transaction() as s:
        draft = s.scalars(select(AdrDraft)).one_or_none()
    adr_id = draft.adr_id if draft else await h.bot.drafts.draft(done.incident_id, author="U1")
    adrs = SharedAdrStore(root=Path("adr"), db=h.bot.db, sync=False)
    return done, render(adrs.get_or_raise(adr_id))


async def test_a_kept_change_drafts_the_shape_its_judging_canary_sent(h: Harness) -> None:
    done, markdown = await _apply(h)
    assert done.state == "promoted"
    # stored with the remediation's result, next to the before-run's numbers
    assert done.result["workload_shape"] == JUDGING_SHAPE.model_dump(mode="json")
    assert done.result["before_numbers"]["tpot_p99_ms"] == 60.0
    drafted = parse(markdown)
    assert drafted.workload == JUDGING_SHAPE != BEFORE_SHAPE
    context = markdown.split("## 2. ", 1)[0]
    assert context_line(JUDGING_SHAPE) in context
    assert context_line(BEFORE_SHAPE) not in markdown


async def test_a_rolled_back_change_drafts_the_shape_of_the_canary_that_failed_it(
    h: Harness, canary: ShapedCanary
) -> None:
    canary.runs[1] = (40.0, JUDGING_SHAPE)  # not half the before-run's 60 ms: rolled back
    done, markdown = await _apply(h)
    # (the rollback then finds no engine to verify at the memory actuator's URL: 'failed')
    assert done.result["failures"] == ["TPOT p99 40ms > 30ms"]
    assert done.result["workload_shape"] == JUDGING_SHAPE.model_dump(mode="json")
    assert parse(markdown).workload == JUDGING_SHAPE
    assert context_line(JUDGING_SHAPE) in markdown


async def test_a_canary_that_says_no_shape_drafts_no_workload(
    h: Harness, canary: ShapedCanary
) -> None:
    canary.runs[1] = (21.5, None)  # a report from before canaries said their shape
    done, markdown = await _apply(h)
    assert done.state == "promoted" and done.result["workload_shape"] is None
    assert parse(markdown).workload is None
    assert "workload:" not in markdown and "Measured at" not in markdown


async def test_an_adr_that_records_its_workload_is_judged_under_it_before_and_after(
    h: Harness, canary: ShapedCanary, tmp_path: Path
) -> None:
    path = tmp_path / "adr" / f"{ADR}-chunk-long-prefills.md"
    _, front, body = path.read_text().split("---\n", 2)
    data = yaml.safe_load(front) | {"workload": JUDGING_SHAPE.model_dump(mode="json")}
    path.write_text(f"---\n{yaml.safe_dump(data, sort_keys=False)}---\n{body}")
    done, _ = await _apply(h)
    assert done.state == "promoted"
    assert canary.replayed == [JUDGING_SHAPE, JUDGING_SHAPE]  # the before-run and the judge


async def test_an_adr_without_a_workload_runs_the_targets_canary_load(
    h: Harness, canary: ShapedCanary
) -> None:
    await _apply(h)
    assert canary.replayed == [None, None]
