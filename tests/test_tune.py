"""`ruleloop tune`: plans, gate verdicts, the pick, the draft, and one real run on vLLM."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner

from bot.adr.models import Adr, AdrGates
from bot.adr.parse import load, parse
from bot.adr.render import render
from bot.adr.validate import validate
from bot.adr.workload import shape as shapes
from bot.adr.workload.describe import context_line
from bot.adr.workload.shape import WorkloadShape
from bot.app.cli import cli
from bot.canary.client import Outcome, RequestRecord
from bot.canary.report import CanaryMeasurement, Gates
from bot.canary.schema import CanaryReport
from bot.canary.shape_replay import fixed_shape
from bot.canary.verdict import Values, gates_from, judge_values
from bot.engine.process import EngineManager
from bot.kernel.errors import UsageError
from bot.tune.draft import NO_PICK, build_draft
from bot.tune.matrix import RECOMMENDED, TrialRow, recommend
from bot.tune.plan import Experiment, TunePlan, WorkloadSpec, load_plan
from tests.workload_pages import long_system_prompt


def _plan(**changes: object) -> TunePlan:
    fields: dict[str, object] = {
        "title": "Step budget for chats beside long prompts",
        "baseline": {"enforce-eager": True, "max-num-batched-tokens": 8192},
        "experiments": [
            Experiment(name="mnbt-512", engine_args={"max-num-batched-tokens": 512}),
            Experiment(name="default-budget", engine_args={"max-num-batched-tokens": None}),
        ],
    }
    return TunePlan(**(fields | changes))


def test_plan_configs_apply_each_experiment_to_the_baseline() -> None:
    configs = _plan().configs()
    assert [(c.name, c.argv) for c in configs] == [
        ("baseline", ["--enforce-eager", "--max-num-batched-tokens", "8192"]),
        ("mnbt-512", ["--enforce-eager", "--max-num-batched-tokens", "512"]),
        ("default-budget", ["--enforce-eager"]),
    ]
    assert [c.label() for c in configs] == [
        "baseline: `--enforce-eager --max-num-batched-tokens 8192`",
        "mnbt-512: `--max-num-batched-tokens 512`",
        "default-budget: `no --max-num-batched-tokens`",
    ]


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"baseline": {"block-size": 7}}, "baseline: block-size: 7 is out of range"),
        ({"experiments": [Experiment(name="tp", engine_args={"tensor-parallel-size": 2})]},
         "experiment tp: tensor-parallel-size: 'tensor-parallel-size' is not a tunable flag"),
        ({"experiments": [Experiment(name="x", engine_args={"kv-cache-dtype": "fp8 && reboot"})]},
         "experiment x: kv-cache-dtype: value 'fp8 && reboot' contains whitespace"),
        ({"experiments": [Experiment(name="baseline")]}, "experiment names must be unique"),
    ],
)  # fmt: skip
def test_plan_refuses_bad_flags_before_any_engine_starts(
    changes: dict[str, object], why: str
) -> None:
    with pytest.raises(UsageError, match=why):
        _plan(**changes).configs()


def test_load_plan_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(
        "experiments:\n  - name: a\n    engine_args: {block-size: 32}\nworkload: {concurency: 3}\n"
    )
    with pytest.raises(UsageError, match=r"plan.yaml: workload.concurency: Extra inputs"):
        load_plan(path)
    path.write_text("experiments: []\n")  # a file may leave them to the command line's --exp
    with pytest.raises(UsageError, match=r"plan: give at least one experiment .* or a space"):
        load_plan(path).check_kind()
    path.write_text(
        "experiments:\n  - name: a\nspace: {max-num-seqs: {values: [4, 8]}}\n"
        "objective: {maximize: goodput_rps}\n"
    )
    with pytest.raises(UsageError, match=r"plan.yaml: plan: .*give experiments: .* not both"):
        load_plan(path)


def test_background_workload_runs_until_cancelled() -> None:
    spec = WorkloadSpec(name="agent", prompt_length=2048, prefix_length=1536, output_length=8)
    workload = spec.workload("http://127.0.0.1:9", background=True)
    assert (workload.num_requests, workload.warmup_requests) == (None, 0)
    assert workload.duration_s is not None and workload.duration_s >= 3600
    assert spec.describe(background=True).startswith("agent: alongside until the canary ends")


def test_a_workload_shape_is_replayed_by_every_configuration(tmp_path: Path) -> None:
    path = tmp_path / "prod.yaml"
    shapes.save(long_system_prompt(), path)
    spec = WorkloadSpec(shape=path, num_requests=24, concurrency=4)
    workload = spec.workload("http://127.0.0.1:9")
    assert workload.shape == long_system_prompt() and workload.num_requests == 24
    assert spec.describe() == f"canary: 24 requests, at most 4 streams, replaying {path}"
    with pytest.raises(ValueError, match="prompt_length contradict the workload shape"):
        WorkloadSpec(shape=path, prompt_length=512)


def test_cli_tune_refuses_a_bad_shape_file_before_starting_engines(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 2\n")
    args = ["tune", "--adr-dir", str(tmp_path / "adr"), "--state-dir", str(tmp_path / "s"),
            "--exp", "a=--block-size 32", "--workload", str(bad)]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "bad.yaml" in result.stderr and "version" in result.stderr
    assert not (tmp_path / "s").exists()


GATES = AdrGates(max_ttft_p99_ms=350, max_tpot_p99_ms=35, min_goodput_ratio=0.95)


def _rows(plan: TunePlan, *values: Values | None) -> list[TrialRow]:
    rows = []
    for config, v in zip(plan.configs(), values, strict=True):
        if v is None:
            rows.append(
                TrialRow(
                    config,
                    error="vLLM exited: ValueError: No common block size for 48 (full log: /x.log)",
                    failed_at="refused",
                )
            )
        else:
            gates = gates_from(plan.gates or AdrGates())
            failures = judge_values(v, gates, error_gate=False).failures
            rows.append(TrialRow(config, values=v, failures=failures))
    return rows


def test_recommend_picks_most_headroom_on_tightest_gate() -> None:
    plan = _plan(gates=GATES)
    rows = _rows(
        plan, Values(340, 34, 0.99, None), Values(200, 30, 0.99, None), Values(100, 34.9, 1.0, None)
    )
    assert recommend(rows, plan.gates) is rows[1]
    assert [r.verdict() for r in rows] == ["达标 (pass)", RECOMMENDED, "达标 (pass)"]


def test_recommend_without_gates_scores_against_the_baseline() -> None:
    plan = _plan()
    baseline, faster_tpot_slower_ttft, better_both = (
        Values(400, 100, 1, None),
        Values(600, 60, 1, None),
        Values(380, 90, 1, None),
    )
    rows = _rows(plan, baseline, faster_tpot_slower_ttft, better_both)
    # Scored by the worse of TTFT/baseline and TPOT/baseline: 1.0, 1.5 and 0.95.
    assert recommend(rows, plan.gates) is rows[2]


def test_recommend_returns_none_when_nothing_passes_and_draft_says_so(tmp_path: Path) -> None:
    plan = _plan(gates=GATES)
    rows = _rows(plan, Values(900, 34, 0.99, None), None, Values(100, 50, 1.0, None))
    assert recommend(rows, plan.gates) is None
    draft = build_draft(plan, rows, adr_id="ADR-20261129-01", day=dt.date(2026, 11, 29),
                        runs_dir=tmp_path, base=tmp_path)  # fmt: skip
    assert draft.fix.engine_args == {} and draft.rules == [NO_PICK]
    assert draft.matrix[0].verdict == "不达标 (fail: TTFT p99 900ms > 350ms)"
    assert draft.matrix[1].verdict == (
        "引擎拒绝 (refused by vLLM): vLLM exited: ValueError: No common block size for 48"
    )


def _report(shape: WorkloadShape, ttft_s: float = 0.2) -> CanaryReport:
    """A canary JSON report as the runner keeps it for a row (it says the shape it sent)."""
    records = []
    for k in (0.5, 0.8, 1.0):
        r = RequestRecord(sent_at=10.0, first_token_at=10.0 + ttft_s * k, finished_at=11.0 + k)
        r.output_tokens, r.outcome = 33, Outcome.OK
        records.append(r)
    report = CanaryMeasurement(
        shape=shape, workload={"concurrency": 8}, records=records, engine=None, samples=[],
        gates=Gates(), wall_s=2.0, client_cpu_s=0.1,
    )  # fmt: skip
    return report.report()


def test_the_draft_records_the_workload_its_rows_were_measured_under(tmp_path: Path) -> None:
    agents = WorkloadSpec(prompt_length=2048, prefix_length=1536, output_length=64)
    plan = _plan(gates=GATES, workload=agents)
    rows = _rows(
        plan, Values(340, 34, 0.99, None), Values(200, 30, 0.99, None), Values(100, 50, 1.0, None)
    )
    # at fixed concurrency each run measures its own rate: the shapes differ in it
    canary = plan.workload.workload("http://127.0.0.1:9")
    shapes = [fixed_shape(canary, request_rate=rate) for rate in (2.0, 3.5, 3.0)]
    for row, measured in zip(rows, shapes, strict=True):
        row.report = _report(measured)
    pick = recommend(rows, plan.gates)
    assert pick is rows[1]

    def draft() -> Adr:
        return build_draft(plan, rows, adr_id="ADR-20261129-01", day=dt.date(2026, 11, 29),
                           runs_dir=tmp_path, base=tmp_path)  # fmt: skip

    adr = draft()
    assert adr.workload == shapes[1]  # the recommended row's run: the flags the fix sets
    text = render(adr)
    context = text.split("## 2. ", 1)[0]
    assert context_line(shapes[1]) == (
        "Measured at prompt p50 2,000–5,000 / p99 2,000–5,000 tokens, output p50 50–100 tokens, "
        "100.0 % sharing a 1,536-token prefix, 3.5 req/s, 8 concurrent."
    )
    assert context.rstrip().endswith(context_line(shapes[1]))
    assert parse(text) == adr

    pick.recommended = False  # nothing recommended: the first measured row's (the baseline's)
    assert draft().workload == shapes[0]
    for row in rows:
        row.report = None  # reports without a shape (or no run at all): nothing is said
    assert draft().workload is None and "Measured at" not in render(draft())


@pytest.mark.parametrize(
    ("failed_at", "label"),
    [
        ("refused", "引擎拒绝 (refused by vLLM): "),
        ("start", "引擎未启动 (engine did not start): "),
        ("canary", "测量失败 (canary failed): "),
    ],
)
def test_rows_without_numbers_say_why(failed_at: str, label: str) -> None:
    row = TrialRow(_plan().configs()[0], error="it broke (full log: /tmp/x.log)", failed_at=failed_at)  # type: ignore[arg-type]
    assert row.verdict() == label + "it broke"
    assert not row.passed


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--exp", "no-equals-sign"], "write NAME=FLAGS"),
        (["--exp", "a=--tensor-parallel-size 2"], "not a tunable flag"),
        (["--exp", "a=--block-size 7"], "experiment a: block-size: 7 is out of range"),
        (["--baseline", "--enforce-eager; reboot"], "not a tunable flag"),
        ([], "give at least one experiment"),
        (
            ["--exp", "a=--block-size 32", "--gates-from", "ADR-20990101-01"],
            "no ADR ADR-20990101-01",
        ),
    ],
)
def test_cli_tune_refuses_bad_usage_before_starting_engines(
    tmp_path: Path, args: list[str], why: str
) -> None:
    result = CliRunner().invoke(
        cli, ["tune", "--adr-dir", str(tmp_path / "adr"), "--state-dir", str(tmp_path / "s"), *args]
    )
    assert result.exit_code == 2, result.output
    assert why in result.stderr
    assert not (tmp_path / "s").exists()  # no engine was started


@pytest.mark.engine
@pytest.mark.slow
def test_tune_on_real_engine_writes_draft_with_measured_matrix(
    engine_manager: EngineManager, tmp_path: Path
) -> None:
    adr_dir = tmp_path / "adr"
    result = CliRunner().invoke(cli, [
        "tune", "--title", "Step budget smoke test", "--date", "2026-11-29",
        "--baseline", "--enforce-eager",
        "--exp", "mnbt-512=--max-num-batched-tokens 512",
        "--exp", "bs48=--block-size 48",  # CPU attention needs multiples of 32: vLLM refuses it
        "--prompt-length", "48", "--output-length", "8",
        "--num-requests", "16", "--concurrency", "8",
        "--max-ttft-p99-ms", "60000", "--start-timeout", "600",  # a loaded 2-core box is slow
        "--adr-dir", str(adr_dir), "--state-dir", str(engine_manager.state_dir),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output + result.stderr
    assert "[3/3] bs48: refused" in result.stderr  # progress per configuration
    draft_path = adr_dir / "drafts" / "ADR-20261129-01-step-budget-smoke-test.md"
    draft = load(draft_path)
    assert draft.status == "proposed" and validate(adr_dir) == []

    runs = sorted(
        (adr_dir / "drafts" / "ADR-20261129-01-step-budget-smoke-test.runs").glob("*.json")
    )
    assert [p.name for p in runs] == ["01-baseline.json", "02-mnbt-512.json", "03-bs48.json"]
    for row, path in zip(draft.matrix, runs, strict=True):
        data = json.loads(path.read_text())
        report = data["report"]
        if data["refused"]:
            assert row.ttft_p99_ms is None and row.tpot_p99_ms is None
            assert row.verdict.startswith("引擎拒绝 (refused by vLLM)")
            assert (
                "No common block size for 48" in row.verdict
                and "No common block size for 48" in data["error"]
            )
            continue
        assert row.ttft_p99_ms == round(report["ttft_ms"]["p99"], 1)
        assert row.tpot_p99_ms == round(report["tpot_ms"]["p99"], 1)
        assert row.goodput_ratio == round(report["goodput_ratio"], 3)
        frag = report["kv_fragmentation"]["observed"]
        assert row.kv_fragmentation == (None if frag is None else round(frag, 3))
        assert report["requests"]["ok"] == 16
        assert report["engine"]["cache"]["block_size"] == 128  # the engine ran with its own flags

    assert "- mnbt-512: ITL p99 " in draft.matrix_notes  # the supplementary numbers, per row
    picked = [row for row in draft.matrix if row.verdict == RECOMMENDED]
    assert len(picked) == 1
    picked_run = json.loads(runs[draft.matrix.index(picked[0])].read_text())
    assert draft.fix.engine_args == picked_run["engine_args"]
    # the workload the recommended row was measured under, as its canary report says it
    assert draft.workload == WorkloadShape.model_validate(picked_run["report"]["workload_shape"])
    assert context_line(draft.workload) in draft_path.read_text(encoding="utf-8")
    assert render(draft) == draft_path.read_text(encoding="utf-8")
    # Every engine tune started is stopped again.
    ports = [
        urlsplit(json.loads(p.read_text())["report"]["workload"]["endpoint"]).port for p in runs[:2]
    ]
    assert [engine_manager.find(port) for port in ports if port] == [None, None]
