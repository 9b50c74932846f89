"""The demo's decisions without an engine: whether the incident was produced (else it stops with
exit 1 and the reason), the shipped CPU ADR, and the last screen. The whole demo on a real engine
is tests/test_engine_cli.py::test_demo_replays_the_incident_and_drafts_the_adr."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from bot.adr.models import AdrGates
from bot.adr.parse import load
from bot.adr.relative import Relative
from bot.adr.render import render
from bot.app.cli import Command
from bot.app.demo import screen
from bot.app.demo.scenario import (
    ADR_FILE,
    ADR_ID,
    HERE,
    LONG_STREAMS,
    DemoFailed,
    Pace,
    _window,
    check_incident,
    gate_lines,
    phase_times,
    settings,
)
from bot.kernel.numbers.reading import Bound, Measured
from bot.kernel.store.summary import DiagnosisSummary

DEMO_ADR = HERE / ADR_FILE
NORMAL = {"ttft_p99_ms": 39.1, "tpot_p99_ms": 9.9, "goodput_ratio": 1.0, "kv_fragmentation": 0.4}


def summary(tpot_now: float, *, normal: dict[str, Any] | None = NORMAL) -> dict[str, Any]:
    """A stored diagnosis summary (Diagnosis.summary()) with TPOT p99 ``tpot_now`` now."""
    adr = load(DEMO_ADR)
    limit = adr.match[0].value
    assert isinstance(limit, Relative)
    holds = normal is not None and tpot_now > limit.factor * normal["tpot_p99_ms"]
    return {
        "headline": {"ttft_p99_ms": 706.0, "tpot_p99_ms": tpot_now, "goodput_ratio": 1.0},
        "readings": {"vllm_metrics.ttft_p99_ms": 706.0, "vllm_metrics.tpot_p99_ms": tpot_now,
                     "vllm_metrics.goodput_ratio": 1.0},
        "normal": normal or {},
        "matches": [ADR_ID] if holds else [],
    }  # fmt: skip


def test_the_shipped_adr_matches_tpot_relative_to_normal_and_gates_relative_too() -> None:
    adr = load(DEMO_ADR)
    assert adr.status == "accepted" and adr.fix.engine_args == {"max-num-batched-tokens": 512}
    (condition,) = adr.match
    assert (condition.metric, condition.op) == ("tpot_p99_ms", ">")
    assert isinstance(condition.value, Relative)
    assert adr.gates is not None and isinstance(adr.gates.max_tpot_p99_ms, Relative)
    assert render(adr) == DEMO_ADR.read_text(encoding="utf-8")


def test_an_incident_over_the_adrs_multiple_of_normal_goes_on() -> None:
    result = check_incident(load(DEMO_ADR), DiagnosisSummary.of(summary(185.4)))
    assert result.matches
    assert [c.explain() for c in result.conditions] == [
        "tpot_p99_ms 185.4 > 3x normal (= 29.7): holds"
    ]


@pytest.mark.parametrize(
    ("tpot_now", "normal", "why"),
    [
        (19.8, NORMAL, "tpot_p99_ms 19.8 > 3x normal (= 29.7): does not hold"),
        (185.4, None, "tpot_p99_ms > 3x normal: no normal measured for tpot_p99_ms"),
    ],
    ids=["not-slow-enough", "no-normal"],
)
def test_no_incident_stops_the_demo_with_exit_1_and_the_reason(
    tpot_now: float, normal: dict[str, Any] | None, why: str
) -> None:
    with pytest.raises(DemoFailed) as caught:
        check_incident(load(DEMO_ADR), DiagnosisSummary.of(summary(tpot_now, normal=normal)))
    message = str(caught.value)
    assert message.startswith(f"the incident was not produced on this machine, so there is "
                              f"nothing for {ADR_ID} to fix: {why}.")  # fmt: skip

    @click.command(cls=Command)
    def demo() -> None:
        check_incident(load(DEMO_ADR), DiagnosisSummary.of(summary(tpot_now, normal=normal)))

    result = CliRunner().invoke(demo)
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: {message}"


def test_a_diagnosis_that_did_not_match_is_not_overruled() -> None:
    numbers = summary(185.4) | {"matches": []}  # the bot's own verdict wins
    with pytest.raises(DemoFailed, match="holds"):
        check_incident(load(DEMO_ADR), DiagnosisSummary.of(numbers))


def test_the_last_screen_has_the_four_numbers_the_verdict_and_the_paths() -> None:
    gates = AdrGates(max_tpot_p99_ms="0.5x before", min_goodput_ratio=0.8)
    lines = gate_lines(
        gates,
        {"max_tpot_p99_ms": 855.0, "min_goodput_ratio": 0.8},
        {"tpot_p99_ms": 214.8, "goodput_ratio": 0.7},
        {"tpot_p99_ms": 1710.0, "goodput_ratio": 0.9},
        ["min_goodput_ratio"],  # the gates the remediation's judge failed, by name
    )
    assert lines == [
        "TPOT p99 215 ms ≤ 0.5x before (= 855 ms): met (before → after: 1,710 → 215 ms (-87 %))",
        "Goodput 70.0 % ≥ 80.0 %: MISSED (before → after: 90.0 → 70.0 % (-22 %))",
    ]
    text = screen.render(
        screen.DemoResult(
            adr_id=ADR_ID,
            normal=Measured.of(NORMAL, {"tpot_p99_ms": Bound.AT_MOST}),
            incident=Measured.of({"ttft_p99_ms": 706.0, "tpot_p99_ms": 185.4, "goodput_ratio": 1.0}),
            after=Measured.of({"ttft_p99_ms": 497.4, "tpot_p99_ms": 24.3, "goodput_ratio": 0.96}),
            state="promoted",
            matched=["tpot_p99_ms 185.4 > 3x normal (= ≤ 30): holds"],
            gates=lines,
            chart=Path("/ws/charts/incident-1-ttft-queue.png"),
            draft=Path("/ws/adr/drafts/ADR-20261130-01-x.md"),
        )
    )
    shown = text.splitlines()
    header = next(
        i
        for i, line in enumerate(shown)
        if line.split() == ["normal", "incident", "after", "the", "fix"]
    )
    rows = {
        line.split()[0] + line.split()[1]: line.split() for line in shown[header + 1 : header + 5]
    }
    assert rows["TTFTp99"][2:] == ["39.1", "ms", "706", "ms", "497", "ms"]
    # normal's TPOT p99 fell in vLLM's first bucket: only a bound, and shown as one
    assert rows["TPOTp99"][2:] == ["≤", "9.9", "ms", "185", "ms", "24.3", "ms"]
    assert rows["Goodput100.0"] == ["Goodput", "100.0", "%", "100.0", "%", "96.0", "%"]
    assert rows["KVfragmentation"][2:] == ["40.0", "%", "n/a", "n/a"]
    assert f"ruleloop demo: {ADR_ID} promoted: the canary met every gate" in text
    assert "  TPOT p99 215 ms ≤ 0.5x before (= 855 ms): met" in text
    assert "chart: /ws/charts/incident-1-ttft-queue.png" in text
    assert text.rstrip().endswith("draft: /ws/adr/drafts/ADR-20261130-01-x.md")


def test_the_screens_gate_marks_are_the_canary_judges_word() -> None:
    """The screen does not judge again: a gate is MISSED when the remediation's judge failed it
    (the gate names it stored), whatever its point number looks like, and met otherwise."""
    gates = AdrGates(max_tpot_p99_ms="0.5x before", min_goodput_ratio=0.8)
    limits = {"max_tpot_p99_ms": 100.0, "min_goodput_ratio": 0.8}
    numbers = {"tpot_p99_ms": 60.0, "goodput_ratio": 0.95}
    kept = gate_lines(gates, limits, numbers)
    assert [line.split(": ")[1] for line in kept] == ["met", "met"]
    # under the limit on the point, not decided on eight requests: the judge failed it
    rolled_back = gate_lines(gates, limits, numbers, missed=["max_tpot_p99_ms"])
    assert rolled_back[0].endswith(": MISSED") and rolled_back[1].endswith(": met")


def test_a_diagnosis_that_failed_is_not_mistaken_for_no_incident() -> None:
    with pytest.raises(DemoFailed, match="the bot's diagnosis produced no numbers"):
        check_incident(load(DEMO_ADR), DiagnosisSummary.of({}))


def test_the_demo_stamps_each_step_with_the_time_since_its_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import time

    from bot.app.cli.demo import _elapsed, _stepper

    say = _stepper(time.monotonic() - 125)  # started 2 min 5 s ago
    say("5/10 Alertmanager fires")
    say("    incident #1 opened")
    say("10/10 the re-tune")
    err = capsys.readouterr().err.splitlines()
    assert err == ["[2:05] 5/10 Alertmanager fires", "    incident #1 opened", "[2:05] 10/10 the re-tune"]
    assert _elapsed(3599.9) == "59:59"


def test_a_bad_step_is_seconds_of_this_engines_prefill_within_the_mechanism() -> None:
    # four whole prompts fill a bad step (at most 2048 each) and each fills a fixed step at
    # least (512: the fix spreads a bad step over four or more); between, four take about
    # 2.5 s of this engine's prefill, so a chat token waits as long on a slow machine
    assert Pace(prefill_tok_s=18_000.0, start_s=30.0).long_prompt == 2048  # AVX-512
    assert Pace(prefill_tok_s=1_650.0, start_s=200.0).long_prompt == 1024  # a tenth of a core
    assert Pace(prefill_tok_s=700.0, start_s=200.0).long_prompt == 512  # slower still
    assert Pace(prefill_tok_s=3_000.0, start_s=60.0).long_prompt == 1856  # 1,875, to 64s
    for speed in (1_650.0, 6_000.0, 18_000.0):
        long = Pace(prefill_tok_s=speed, start_s=30.0).long_prompt
        assert long >= 512 and LONG_STREAMS * long <= 8192  # the mechanism holds at every speed


def test_the_fix_phases_are_timed_from_the_remediations_audit_entries() -> None:
    import datetime as dt

    t0 = dt.datetime(2026, 12, 2, 5, 0, tzinfo=dt.UTC)
    at = {
        "remediation.baseline_started": t0,
        "remediation.applying": t0 + dt.timedelta(seconds=72),
        "remediation.canary_started": t0 + dt.timedelta(seconds=120.4),
        "remediation.canary_passed": t0 + dt.timedelta(seconds=139.6),
    }
    assert phase_times(at) == "before-run 1:12, restart 0:48, canary 0:19"
    # a rollout refused before its canary: only what happened is timed
    assert phase_times({k: at[k] for k in list(at)[:2]}) == "before-run 1:12"
    assert phase_times({}) == "no phase timed"


def test_the_demos_bounds_and_windows_come_from_what_was_measured(tmp_path: Path) -> None:
    fast, slow = (
        Pace(prefill_tok_s=18_000.0, start_s=25.0),
        Pace(prefill_tok_s=1_800.0, start_s=200.0),
    )
    assert slow.request_s(32) > 5 * fast.request_s(32) - 30
    assert (fast.restart_s, slow.restart_s) == (60.0, 400.0)  # twice the first start, 60 s at least
    spec = settings(tmp_path, base_url="http://127.0.0.1:8000", state_dir=tmp_path, pace=slow)
    target = spec.targets["local"]
    assert target.actuator is not None and target.actuator.start_timeout_s == slow.restart_s
    # the gate's background: four chunks of the fix whatever the speed; the canary's own
    # deadline (its background's too) from the measured speed
    assert target.canary.background_prompt_length == 4 * 512
    assert target.canary.timeout_s == slow.canary_s > fast.canary_s
    # a window holds a finished chat of every stream: 1.5x the slowest, 3 s at least
    assert (_window(0.4), _window(14.6)) == (3.0, 22.0)
