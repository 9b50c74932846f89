"""The eval's CI subset on real vLLM engines (issue 43): every landing proves the benchmark.

`ruleloop eval --subset fast`'s scenarios (bench/incidents/, ``subset: fast``), run in-process by
the product's own runner: each fault induced on a real engine, the load sized from what that
engine was measured to do, the production diagnosis (shipped runbooks, real probes on /metrics,
the catalogue's ADR) graded against the scenario's truth. The subset replaced the confusion
matrix of tests/test_causes_engine.py: the induced cause is the one supported, no cause is ruled
out wrongly, the healthy engine supports none, and the ADR offered is the right one (the step
cap for step mixing, none elsewhere). A runbook whose threshold misses a cause scores lower on
the same readings.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.adr import AdrStore
from bot.app.cli import cli
from bot.diagnosis.runbooks import default_registry, load_dir
from bot.eval import Ran, load_catalogue, markdown, regrade, report, run_catalogue

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.usefixtures("box_alone")]

ROOT = Path(__file__).parent.parent
CATALOGUE = ROOT / "bench" / "incidents"


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Ran]:
    scenarios = load_catalogue(CATALOGUE, subset="fast")
    runs = run_catalogue(
        scenarios, runbooks=load_dir(ROOT / "runbooks", default_registry()),
        adrs=AdrStore(root=CATALOGUE / "adr"), state_dir=tmp_path_factory.mktemp("eval"),
        echo=print,
    )  # fmt: skip
    return {r.graded.scenario: r for r in runs}


@pytest.mark.parametrize("name", ["healthy", "step-mixing", "queueing", "abandoned-work",
                                  "kv-pressure"])  # fmt: skip
def test_each_induced_cause_is_the_one_named_and_the_others_ruled_out(
    name: str, ran: dict[str, Ran]
) -> None:
    g = ran[name].graded
    shown = {r: ran[name].diagnosis.readings.value(r) for r in (
        "vllm_metrics.max_step_tokens", "vllm_metrics.queue_ttft_share",
        "vllm_metrics.preemptions_per_s", "vllm_metrics.kv_cache_usage",
        "vllm_metrics.aborted_share", "queue_cancel.wasted_prefill_share")}  # fmt: skip
    print(f"\n{name}: window {g.window_s:.1f} s, {g.sent} requests; supported {g.supported}, "
          f"ruled out {g.ruled_out}, cannot tell {g.cannot_tell}\nreadings {shown}")  # fmt: skip
    assert g.grade == 100, (g.why, shown)
    assert g.supported == g.truth, (g, shown)
    # nothing the truth names as a cause is ruled out; what is left undecided costs recall, which
    # the table reports (at a tenth of a core, KV pressure's recomputed prefills have read as 6 %
    # "wasted", leaving abandoned_work undecided)
    assert g.ruled_out_precision in (1.0, None), (g, shown)
    assert g.sent > 0
    assert g.adr_right is True, g.adr_offered  # the step cap for step mixing, else none


def test_a_runbook_that_misses_a_cause_scores_lower(ran: dict[str, Ran], tmp_path: Path) -> None:
    """The step-mixing readings judged by a runbook whose step threshold no step can reach."""
    changed = tmp_path / "runbooks"
    changed.mkdir()
    for path in (ROOT / "runbooks").glob("*.yaml"):
        text, n = re.subn(r"max_step_tokens > 4096", "max_step_tokens > 1000000", path.read_text())
        (changed / path.name).write_text(text)
    assert n > 0, "the step-mixing hypothesis no longer reads max_step_tokens > 4096"
    runbooks = load_dir(changed, default_registry())
    scenarios = {s.name: s for s in load_catalogue(CATALOGUE, subset="fast")}
    before = [r.graded for r in ran.values()]
    after = [regrade(r, scenarios[name], runbooks) for name, r in ran.items()]
    mixing = next(g for g in after if g.scenario == "step-mixing")
    assert mixing.grade < 100 and "prefill_decode_mixing" not in mixing.supported, mixing
    assert (
        report(after, subset="fast").summary.mean_grade
        < report(before, subset="fast").summary.mean_grade
    )
    # the shipped runbooks re-judge the same readings to the same grades (regrade is faithful)
    shipped = load_dir(ROOT / "runbooks", default_registry())
    assert [regrade(r, scenarios[n], shipped).grade for n, r in ran.items()] == [
        g.grade for g in before
    ]


def test_the_table_and_its_json(ran: dict[str, Ran]) -> None:
    r = report([x.graded for x in ran.values()], subset="fast")
    text = markdown(r)
    assert f"mean cause grade **{r.summary.mean_grade:.1f}** over 5 scenarios" in text
    assert r.machine.engine.startswith("vllm ") and r.machine.engine != "vllm unknown"
    assert json.loads(r.model_dump_json())["summary"]["scenarios"] == 5


def test_the_cli_runs_one_scenario_and_fails_under_a_floor(tmp_path: Path) -> None:
    """`ruleloop eval --only healthy` writes its table; an unreachable --min-grade exits 1."""
    result = CliRunner().invoke(cli, ["eval", "--only", "healthy", "--scenarios", str(CATALOGUE),
                                      "--runbooks", str(ROOT / "runbooks"),
                                      "--out", str(tmp_path),
                                      "--min-grade", "100"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "| healthy | no engine cause | (none) | 100 |" in result.output
    assert len(list(tmp_path.glob("eval-*.json"))) == 1
