"""A length quantile is known only to the bucket of vLLM's histogram it fell in: every surface
shows it as that bucket ("prompt p50 2,000–5,000 tokens"), never as a point interpolated inside
it, and diffs and the drift job compare the buckets: overlapping ones are not a change, disjoint
ones give the factor as a bound from their nearest edges."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.adr.parse import parse as parse_adr
from bot.adr.render import render
from bot.adr.workload import diff as diffs
from bot.adr.workload.describe import context_line, earlier_context_line
from bot.adr.workload.shape import Lengths, TokenRange, parse
from bot.app.scheduler import messages
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import FakeSlack
from tests.test_scheduler_workload_drift import (
    ADR,
    PER_SCRAPE,
    ShapeCanary,
    Traffic,
    incidents,
    record_workload,
    tick,
)
from tests.workload_pages import shape

FIXED = shape([2048] * 40, [64] * 40)  # the demo's long prompts: exactly 2,048 tokens


def edged(buckets: dict[str, float]) -> Lengths:
    return Lengths(count=100, buckets=buckets)


# --- shown as the bucket ----------------------------------------------------------------------
def test_a_fixed_2048_token_prompt_reads_as_its_bucket_on_every_surface() -> None:
    prompt = FIXED.prompt_tokens
    assert prompt.quantile("p50") == TokenRange(2000.0, 5000.0)
    line = context_line(FIXED)
    assert line.startswith("Measured at prompt p50 2,000–5,000 / p99 2,000–5,000 tokens, ")
    assert "output p50 50–100 tokens" in line
    # the interpolated points (3,500 and 4,970) are said nowhere
    slack = messages.workload_alike("prod-a", [], FIXED)
    shown = [line, prompt.summary(), slack, *diffs.diff(FIXED, FIXED).lines()]
    for text in shown:
        assert "3,500" not in text and "4,970" not in text, text
    assert prompt.summary().startswith("p50 2,000–5,000, p90 2,000–5,000, p99 2,000–5,000 (")
    assert "sends the traffic  were measured under again: prompt p50 2,000–5,000 " in slack


def test_bounds_and_one_length_buckets() -> None:
    """The first bucket is only 'at most its edge', the +Inf one 'more than the last edge'; a
    bucket that holds one whole number, (1, 2], is that number."""
    assert shape([1] * 5, [1] * 5).prompt_tokens.quantile("p50").text() == "≤ 1"
    assert shape([20_000] * 5, [1] * 5).prompt_tokens.quantile("p99").text() == "> 10,000"
    two = shape([2] * 5, [1] * 5).prompt_tokens.quantile("p50")
    assert (two.text(), two.point) == ("2", 2.0)
    assert TokenRange(2.0, 5.0).point is None and TokenRange(2.0, 5.0).text() == "2–5"


# --- compared as ranges -----------------------------------------------------------------------
def test_an_overlapping_diff_is_not_called_smaller() -> None:
    """2,048-token prompts against prompts of 2,100-3,900: the same bucket, so no change."""
    rng = random.Random(3)
    spread = shape([rng.randint(2100, 3900) for _ in range(40)], [64] * 40)
    dim = diffs.quantile_ratio("prompt_tokens", "prompt tokens", "p50", FIXED.prompt_tokens,
                               spread.prompt_tokens)  # fmt: skip
    assert dim.line == (
        "prompt tokens p50 2,000–5,000 -> 2,000–5,000 tokens (about the same bucket, limit 2x): "
        "alike"
    )
    assert not dim.drifted and dim.distance == 1.0 and (dim.old, dim.new) == (None, None)
    # ranges from other edges that overlap in part are no change either
    wide = edged({"1000": 0.0, "3000": 1.0})
    part = diffs.quantile_ratio("p", "prompt tokens", "p50", wide, FIXED.prompt_tokens)
    assert "(ranges overlap, limit 2x): alike" in part.line and not part.drifted
    assert "smaller" not in part.line and "bigger" not in part.line


def test_a_disjoint_diff_gives_the_factor_as_a_bound_from_the_nearest_edges() -> None:
    near = shape([1500] * 40, [64] * 40)  # the next bucket down: (1,000, 2,000]
    dim = diffs.quantile_ratio("prompt_tokens", "prompt tokens", "p50", FIXED.prompt_tokens,
                               near.prompt_tokens)  # fmt: skip
    assert dim.line == (
        "prompt tokens p50 2,000–5,000 -> 1,000–2,000 tokens (more than 1.0x smaller, "
        "limit 2x): undecided (from 1.0x to 5.0x)"
    )
    assert not dim.drifted and not dim.decided
    far = shape([150] * 40, [64] * 40)  # (100, 200]: at least 2,000 / 200 = 10x smaller
    dim = diffs.quantile_ratio("prompt_tokens", "prompt tokens", "p99", FIXED.prompt_tokens,
                               far.prompt_tokens)  # fmt: skip
    assert "2,000–5,000 -> 100–200 tokens (more than 10.0x smaller, limit 2x): DRIFTED" in dim.line
    assert dim.drifted and dim.distance == 10.0
    data = json.loads(json.dumps(dim.as_dict()))
    assert (data["old_range"], data["new_range"]) == (["2000", "5000"], ["100", "200"])


def test_an_exact_factor_only_between_two_single_lengths() -> None:
    """(2, 3] holds only 3 and (1, 2] only 2: 2 -> 3 is exactly 1.5x, within the limit."""
    two, three = edged({"1": 0.0, "2": 1.0}), edged({"2": 0.0, "3": 1.0})
    dim = diffs.quantile_ratio("p", "output tokens", "p50", two, three)
    assert dim.line == "output tokens p50 2 -> 3 tokens (1.5x bigger, limit 2x): alike"
    assert (dim.old, dim.new) == (2.0, 3.0)


# --- stored before ----------------------------------------------------------------------------
def test_a_shape_stored_with_interpolated_points_still_loads_and_reads_as_buckets() -> None:
    data = FIXED.model_dump(mode="json")
    assert data["prompt_tokens"]["p50"] == 3500.0  # the file keeps its fields and buckets
    stored = parse(json.dumps(data), kind="json")
    assert stored == FIXED and stored.prompt_tokens.buckets == FIXED.prompt_tokens.buckets
    assert "prompt p50 2,000–5,000 / p99 2,000–5,000 tokens" in context_line(stored)


def test_an_adr_written_with_the_earlier_line_keeps_only_the_new_one() -> None:
    text = render(parse_adr(_seed()).model_copy(update={"workload": FIXED}))
    old = earlier_context_line(FIXED)
    assert old.startswith("Measured at prompt p50 3,500 / p99 4,970 tokens")
    written_then = text.replace(context_line(FIXED), old)
    again = render(parse_adr(written_then))
    assert old not in again and again.count(context_line(FIXED)) == 1


def _seed() -> str:
    shipped = Path(__file__).parent.parent / "bot" / "shipped" / "adr"
    return next(shipped.glob(f"{ADR}-*.md")).read_text(encoding="utf-8")


# --- the drift job ----------------------------------------------------------------------------
class Lengthed(Traffic):
    """Traffic whose prompts are drawn from ``range`` (inclusive) and whose outputs are all 64."""

    def __init__(self) -> None:
        super().__init__()
        self.range = (2001, 5000)

    def _next(self) -> None:
        for _ in range(PER_SCRAPE):
            self.prompts.append(self._rng.randint(*self.range))
            self.outputs.append(64)


@pytest.fixture
def traffic() -> Lengthed:
    return Lengthed()


@pytest.fixture
async def h(tmp_path: Path, slack: FakeSlack, traffic: Lengthed) -> AsyncIterator[Harness]:
    scheduler = {"workload_every_s": 300, "workload_window_s": 60,
                 "targets": {"prod-a": {"adrs": [ADR]}}}  # fmt: skip
    harness_ = harness(tmp_path, slack=slack, scheduler=scheduler, transport=traffic.transport(),
                       bot_options={"gate": ShapeCanary()})  # fmt: skip
    record_workload(Path(harness_.bot.flows.settings.paths.adr), FIXED)
    yield harness_
    await harness_.close()


async def test_the_drift_job_does_not_fire_on_a_change_inside_one_bucket(
    h: Harness, slack: FakeSlack, traffic: Lengthed
) -> None:
    traffic.range = (2001, 5000)  # the ADR's 2,048 tokens, spread over its whole bucket
    result = await tick(h)
    assert result.detail["drifted"] == [], result.detail["dimensions"]
    assert incidents(h) == [] and slack.of("chat.postMessage") == []


async def test_the_drift_job_fires_on_a_disjoint_change(
    h: Harness, slack: FakeSlack, traffic: Lengthed
) -> None:
    traffic.range = (101, 200)
    result = await tick(h)
    assert result.detail["drifted"] == [ADR]
    moved = result.detail["dimensions"][ADR]
    assert "prompt tokens p50 2,000–5,000 -> 100–200 tokens (more than 10.0x smaller, " in (
        " ".join(moved)
    )
    (incident,) = incidents(h)
    text = slack.of("chat.postMessage")[-1].args["text"]
    assert f"*{ADR}* was measured at prompt p50 2,000–5,000 / p99 2,000–5,000 tokens" in text
    assert "Production now sends prompt p50 100–200 / p99 100–200 tokens" in text
    assert incident.target == "prod-a"
