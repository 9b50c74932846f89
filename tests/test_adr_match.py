"""`match` conditions against canary and diagnosis reports, and the adr CLI around the store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from bot.adr.match import read_metric
from bot.adr.metrics import METRICS
from bot.adr.models import Condition
from bot.adr.parse import load
from bot.adr.store import AdrStore, slugify
from bot.app.cli import cli

ADR_DIR = Path(__file__).parent.parent / "adr"
DEMO_ADR = (
    Path(__file__).parent.parent / "bot" / "app" / "demo" / "ADR-20261129-02-cpu-demo-scheduler-step.md"
)


def canary_report(
    *, ttft_p99: float, goodput: float | None, cancelled: int = 0
) -> dict[str, object]:
    """The parts of a canary JSON report (`ruleloop canary --output-json`) that match reads."""
    return {
        "passed": False,
        "ttft_ms": {
            "p50": ttft_p99 / 3,
            "p90": ttft_p99 / 2,
            "p99": ttft_p99,
            "mean": ttft_p99 / 3,
        },
        "tpot_ms": {"p50": 20.0, "p90": 30.0, "p99": 45.0, "mean": 22.0},
        "goodput_ratio": goodput,
        "kv_fragmentation": {"observed": 0.184, "internal": 0.05},
        "requests": {"ok": 100 - cancelled, "cancelled": cancelled, "failed": 0, "total": 100},
        "engine": {"kv_cache_usage": 0.98, "requests_waiting": 37.0, "ttft_ms": {"p99": None}},
        "workload": {"concurrency": 200, "prompt_length": 4096, "prefix_length": 0},
    }


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ttft_p99_ms", 1200.0),
        ("tpot_p99_ms", 45.0),
        ("goodput_ratio", 0.62),
        ("kv_fragmentation", 0.184),
        ("kv_fragmentation_internal", 0.05),
        ("kv_cache_usage", 0.98),
        ("requests_waiting", 37.0),
        ("concurrency", 200.0),
        ("cancelled_share", 0.38),
        ("engine_ttft_p99_ms", None),  # present but null: not a number
        ("wasted_prefill_tokens", None),  # absent
    ],
)
def test_read_metric_finds_each_name_in_a_canary_report(name: str, value: float | None) -> None:
    assert read_metric(canary_report(ttft_p99=1200, goodput=0.62, cancelled=38), name) == value


def test_read_metric_prefers_a_diagnosis_flat_metrics_mapping() -> None:
    report = canary_report(ttft_p99=100, goodput=1.0) | {
        "metrics": {"ttft_p99_ms": 4500, "goodput_ratio": True}
    }
    assert read_metric(report, "ttft_p99_ms") == 4500.0
    assert read_metric(report, "goodput_ratio") is None  # a bool is not a reading


def test_every_metric_name_has_a_description() -> None:
    assert all(isinstance(desc, str) and desc for _, desc in METRICS.values())


@pytest.mark.parametrize(
    ("op", "value", "holds"),
    [
        (">", 1000, True),
        (">=", 1200, True),
        ("<", 1200, False),
        ("<=", 1200, True),
        ("==", 1200, True),
        ("!=", 1200, False),
    ],
)
def test_condition_operators(op: str, value: float, holds: bool) -> None:
    from bot.adr.match import check, read_report

    result = check(
        Condition(metric="ttft_p99_ms", op=op, value=value),
        read_report(canary_report(ttft_p99=1200, goodput=0.6)),
    )
    assert result.holds is holds


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "adr"
    shutil.copytree(ADR_DIR, root, ignore=shutil.ignore_patterns("*.runs", "drafts"))
    return root


def _json(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    return path


# The seed's own matrix: its baseline row shows the symptoms, its recommended row does not.
@pytest.mark.parametrize(
    ("ttft", "goodput", "matched"),
    [(1200, 0.62, True), (850, 0.81, False), (310, 0.96, False), (4500, None, False)],
)
def test_cli_match_lists_accepted_adrs_whose_conditions_hold(
    store: Path, tmp_path: Path, ttft: float, goodput: float | None, matched: bool
) -> None:
    report = _json(tmp_path, canary_report(ttft_p99=ttft, goodput=goodput))
    result = CliRunner().invoke(cli, ["adr", "match", str(report), "--adr-dir", str(store)])
    assert result.exit_code == 0, result.output
    assert ("ADR-20260831-01  vLLM" in result.output) is matched
    if matched:
        assert (
            "fix: --enable-chunked-prefill --max-num-batched-tokens 2048 --block-size 32"
            in result.output
        )
        assert f"ttft_p99_ms {ttft:g} > 1000: holds" in result.output
    else:
        assert "no accepted ADR matches" in result.output


def test_cli_match_json_and_proposed_adrs_never_match(store: Path, tmp_path: Path) -> None:
    report = _json(tmp_path, canary_report(ttft_p99=1200, goodput=0.5))
    out = CliRunner().invoke(cli, ["adr", "match", str(report), "--adr-dir", str(store), "--json"])
    assert [m["id"] for m in json.loads(out.output)] == ["ADR-20260831-01"]
    seed = store / "ADR-20260831-01-kv-cache-paging-throughput.md"
    seed.write_text(
        seed.read_text(encoding="utf-8").replace("status: accepted", "status: proposed"),
        encoding="utf-8",
    )
    out = CliRunner().invoke(cli, ["adr", "match", str(report), "--adr-dir", str(store), "--json"])
    assert json.loads(out.output) == []


def test_cli_match_multiplies_relative_conditions_by_the_normal_report(
    store: Path, tmp_path: Path
) -> None:
    # the demo's ADR: tpot_p99_ms > 3x normal; the incident's canary has TPOT p99 45 ms
    shutil.copy(DEMO_ADR, store)
    incident = _json(tmp_path, canary_report(ttft_p99=1200, goodput=0.9))
    normal = tmp_path / "normal.json"

    def run(*extra: str) -> Result:
        args = ["adr", "match", str(incident), "--adr-dir", str(store), *extra]
        return CliRunner().invoke(cli, args)

    alone = run()
    assert alone.exit_code == 0 and "ADR-20261129-02  " not in alone.output
    assert "ADR-20261129-02: tpot_p99_ms > 3x normal: no normal measured" in alone.output
    normal.write_text(json.dumps({"metrics": {"tpot_p99_ms": 10.0}}))
    matched = run("--normal", str(normal))
    assert "ADR-20261129-02  Local CPU engine" in matched.output, matched.output
    assert "fix: --max-num-batched-tokens 512" in matched.output
    normal.write_text(json.dumps({"metrics": {"tpot_p99_ms": 20.0}}))  # 3x = 60 ms > 45 ms
    assert "ADR-20261129-02  " not in run("--normal", str(normal)).output
    normal.write_text(json.dumps({"passed": True}))
    refused = run("--normal", str(normal))
    assert refused.exit_code == 2 and "none of ttft_p99_ms" in refused.stderr


@pytest.mark.parametrize(
    ("content", "why"), [("not json", "cannot read a JSON report"), ("[1, 2]", "is a JSON object")]
)
def test_cli_match_refuses_a_file_that_is_not_a_report(
    tmp_path: Path, content: str, why: str
) -> None:
    path = tmp_path / "r.json"
    path.write_text(content)
    result = CliRunner().invoke(cli, ["adr", "match", str(path), "--adr-dir", str(ADR_DIR)])
    assert result.exit_code == 2 and why in result.stderr


def test_cli_list_and_show(store: Path) -> None:
    listed = CliRunner().invoke(cli, ["adr", "list", "--adr-dir", str(store)])
    assert listed.exit_code == 0
    assert (
        "ADR-20260831-01  accepted    2026-08-31  vLLM 推理引擎 KV Cache 换页与吞吐调优决策"
        in listed.output
    )
    shown = CliRunner().invoke(cli, ["adr", "show", "ADR-20260831-01", "--adr-dir", str(store)])
    assert shown.exit_code == 0
    assert "## 2. 实验对比数据 (Metrics Matrix)" in shown.output
    assert (
        "engine argv: --enable-chunked-prefill --max-num-batched-tokens 2048 --block-size 32"
        in shown.output
    )
    as_json = json.loads(
        CliRunner()
        .invoke(cli, ["adr", "show", "ADR-20260831-01", "--json", "--adr-dir", str(store)])
        .output
    )
    assert (
        as_json["gates"]["max_ttft_p99_ms"] == 350
        and as_json["engine_argv"][0] == "--enable-chunked-prefill"
    )
    missing = CliRunner().invoke(cli, ["adr", "show", "ADR-20990101-01", "--adr-dir", str(store)])
    assert (
        missing.exit_code == 2
        and "no ADR ADR-20990101-01" in missing.stderr
        and "known: ADR-20260831-01" in missing.stderr
    )


def test_cli_new_writes_a_valid_numbered_draft(store: Path) -> None:
    args = [
        "adr",
        "new",
        "--title",
        "Prefix caching for agent prompts",
        "--date",
        "2026-08-31",
        "--supersedes",
        "ADR-20260831-01",
        "--adr-dir",
        str(store),
    ]
    first = CliRunner().invoke(cli, args)
    second = CliRunner().invoke(cli, args + ["--slug", "again"])
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    paths = [Path(first.stdout.strip()), Path(second.stdout.strip())]
    assert [p.name for p in paths] == [
        "ADR-20260831-02-prefix-caching-for-agent-prompts.md",
        "ADR-20260831-03-again.md",
    ]
    draft = load(paths[0])
    assert (draft.status, draft.supersedes) == ("proposed", ["ADR-20260831-01"])
    assert CliRunner().invoke(cli, ["adr", "validate", str(store), "--no-vllm"]).exit_code == 0
    assert [a.id for a in AdrStore(root=store).records(include_drafts=True)][
        -1
    ] == "ADR-20260831-03"


@pytest.mark.parametrize(
    ("title", "slug"),
    [
        ("vLLM 推理引擎 KV Cache 换页与吞吐调优决策", "vllm-kv-cache"),
        ("调优", "decision"),
        ("A/B: 512 vs 8192!", "a-b-512-vs-8192"),
        (
            "Chats beside long agent prompts - scheduler step token budget",
            "chats-beside-long-agent-prompts-scheduler-step",
        ),
    ],
)
def test_slugify_keeps_ascii_words(title: str, slug: str) -> None:
    assert slugify(title) == slug
