"""`ruleloop tune`'s search, without engines: the space (allowlist, values, ranges), the objective
and the gates' violations, the TPE search against deterministic objectives (it finds what is
better by construction, marks failed and infeasible trials so, never measures a flag set
twice), and the command line's refusals before anything starts (approval, exclusion)."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from optuna.trial import TrialState

from bot.adr.models import EngineValue
from bot.adr.workload import shape as shapes
from bot.app.cli import cli
from bot.canary.schema import CanaryReport
from bot.canary.verdict import Gates, Values, judge_values
from bot.change.actuators.base import Deployed
from bot.change.exclusion import TargetBusy, refusal
from bot.change.policy import Policy
from bot.kernel.config import Settings
from bot.kernel.errors import NotAllowed, UsageError
from bot.kernel.store.db import Database
from bot.remediation.records import ChangeRequest, RemediationRecords
from bot.tune.objective import Objective, TrialOutcome, outcome, violations
from bot.tune.on_target import utc_now
from bot.tune.plan import TunePlan, load_plan
from bot.tune.records import TuneRecords
from bot.tune.search import GridSearch, TpeSearch
from bot.tune.space import SearchDimension, Space, build_space, parse_dimension
from tests.fakes.bot import PAGES, harness
from tests.fakes.metrics_server import RecordedMetrics
from tests.fakes.sse_engine import SseEngine
from tests.store_reads import audit_trail
from tests.workload_pages import long_system_prompt

Flags = dict[str, EngineValue]


def space(**dims: SearchDimension) -> Space:
    return build_space({k.replace("_", "-"): v for k, v in dims.items()})


SPACE = space(
    max_num_seqs=SearchDimension(values=[1, 2, 4, 8]),
    max_num_batched_tokens=SearchDimension(low=256, high=1024, step=384),
    enable_prefix_caching=SearchDimension(values=[True, False]),
)


# --- the space ---------------------------------------------------------------------------------


def test_space_enumerates_values_and_ranges_in_plan_order() -> None:
    assert SPACE.size == 4 * 3 * 2
    grid = list(SPACE.grid())
    assert len(grid) == 24 and len({SPACE.key(f) for f in grid}) == 24
    assert grid[0] == {"max-num-seqs": 1, "max-num-batched-tokens": 256,
                       "enable-prefix-caching": True}  # fmt: skip
    assert grid[-1] == {"max-num-seqs": 8, "max-num-batched-tokens": 1024,
                        "enable-prefix-caching": False}  # fmt: skip
    assert SPACE.describe() == (
        "max-num-seqs {1, 2, 4, 8}; max-num-batched-tokens 256..1024 step 384; "
        "enable-prefix-caching {true, false} (24 flag sets)"
    )


@pytest.mark.parametrize(
    ("dims", "why"),
    [
        ({"tensor-parallel-size": SearchDimension(values=[1, 2])},
         "space.tensor-parallel-size: 'tensor-parallel-size' is not a tunable flag, so it cannot be searched"),
        ({"block-size": SearchDimension(values=[16, 7])}, "space.block-size: 7 is out of range"),
        ({"kv-cache-dtype": SearchDimension(low=1, high=3)},
         "kv-cache-dtype is one of auto, .*: a low/high range is for integer flags"),
        ({"--max-num-seqs": SearchDimension(values=[4])}, "without dashes in front: 'max-num-seqs'"),
        ({"max-num-seqs": SearchDimension(low=1, high=10**9)}, "1,000,000,000 values is more than 10,000"),
        ({"max-num-seqs": SearchDimension(low=1, high=1000), "max-num-batched-tokens": SearchDimension(low=16, high=10015)},
         "10,000,000 flag sets is more than 1,000,000"),
        ({}, "give at least one flag to search"),
    ],
)  # fmt: skip
def test_space_refuses_what_is_not_on_the_allowlist_with_the_flag_and_why(
    dims: dict[str, SearchDimension], why: str
) -> None:
    with pytest.raises(UsageError, match=why):
        build_space(dims)


def test_dimensions_from_the_command_line() -> None:
    assert parse_dimension("max-num-seqs=4,8,16") == ("max-num-seqs", SearchDimension(values=[4, 8, 16]))
    assert parse_dimension("max_num_batched_tokens=256..2048/256") == (
        "max-num-batched-tokens", SearchDimension(low=256, high=2048, step=256)
    )  # fmt: skip
    assert parse_dimension("enable-prefix-caching=true,false")[1].points() == [True, False]
    for bad, why in [("max-num-seqs", "write FLAG=V1,V2"), ("max-num-seqs=8..4", "above high"),
                     ("enable-prefix-caching=yes", "true or false"),
                     ("max-num-seqs=4,4", "values repeat")]:  # fmt: skip
        with pytest.raises(UsageError, match=why):
            parse_dimension(bad)


# --- the objective and the gates ---------------------------------------------------------------


def test_objective_reads_its_metric_from_a_canary_report() -> None:
    report = CanaryReport.of({"slo_attainment": 0.75, "throughput": {"requests_per_s": 8.0,
              "output_tokens_per_s": 512.0}, "ttft_ms": {"p99": None, "infinite": 2}})  # fmt: skip
    assert Objective(maximize="goodput_rps").value(report) == 6.0
    assert Objective(maximize="output_tokens_per_s").value(report) == 512.0
    assert Objective(minimize="ttft_p99_ms").value(report) == math.inf  # failed requests
    assert Objective(minimize="tpot_p99_ms").value(report) is None
    with pytest.raises(ValueError, match="exactly one of maximize: or minimize:"):
        Objective()
    with pytest.raises(ValueError, match="ttft_p99_ms is better when higher or lower"):
        Objective(maximize="ttft_p99_ms")


def test_violations_say_how_far_past_each_gate_a_trial_is() -> None:
    gates = Gates.of(max_ttft_p99_ms=200, min_goodput_ratio=0.9)
    met = violations(judge_values(Values(100, 5, 0.99, None, error_rate=0.0), gates))
    assert met == {"max_ttft_p99_ms": -0.5, "min_goodput_ratio": pytest.approx(0.9 / 0.99 - 1),
                   "max_error_rate": -1.0}  # fmt: skip
    missed = violations(judge_values(Values(300, 5, 0.45, None, error_rate=0.0), gates))
    assert missed["max_ttft_p99_ms"] == pytest.approx(0.5)
    assert missed["min_goodput_ratio"] == pytest.approx(1.0)
    unbounded = violations(judge_values(Values(math.inf, 5, 0.99, None, error_rate=0.5), gates))
    assert unbounded["max_ttft_p99_ms"] == 1e6 and unbounded["max_error_rate"] > 0
    report = CanaryReport.of({"ttft_ms": {"p99": 300.0}, "requests": {"total": 4, "ok": 4},
              "tokens": {"delivered": 8}, "slo_attainment": 1, "throughput": {"requests_per_s": 2}})  # fmt: skip
    scored = outcome(Objective(maximize="goodput_rps"), report, Gates.of(max_ttft_p99_ms=200))
    assert scored.value == 2 and not scored.feasible and scored.failed is None


# --- the search against deterministic objectives -----------------------------------------------


def run(
    search: TpeSearch | GridSearch, f: Callable[[Flags], TrialOutcome]
) -> list[tuple[Flags, TrialOutcome]]:
    """Drive a search to its end against ``f``; every proposal and what it gave."""
    seen = []
    while (proposal := search.propose()) is not None:
        result = f(proposal.flags)
        search.report(proposal, result)
        seen.append((proposal.flags, result))
    return seen


def throughput(flags: Flags) -> TrialOutcome:
    """More sequences per step are better by construction; the token budget matters less."""
    value = math.log2(int(flags["max-num-seqs"])) * 10 + int(flags["max-num-batched-tokens"]) / 256
    return TrialOutcome(value=value + (1 if flags["enable-prefix-caching"] else 0), constraints={})


def test_tpe_finds_the_value_better_by_construction_in_half_the_trials() -> None:
    best = max(throughput(f).value or 0 for f in SPACE.grid())
    found = 0
    for seed in range(6):
        search = TpeSearch(SPACE, "maximize", budget=SPACE.size // 2, seed=seed)
        seen = run(search, throughput)
        assert len(seen) == 12
        top = max(seen, key=lambda s: s[1].value or 0)
        assert top[0]["max-num-seqs"] == 8  # the flag value that wins by construction
        found += (top[1].value or 0) == best
    assert found >= 4  # the single best point of 24, in 12 trials, on most seeds


def test_no_flag_set_is_measured_twice_even_when_the_sampler_repeats_itself() -> None:
    small = space(max_num_seqs=SearchDimension(values=[1, 2, 4, 8]),
                  enable_prefix_caching=SearchDimension(values=[True, False]))  # fmt: skip
    search = TpeSearch(small, "maximize", budget=small.size, seed=3)
    seen = run(search, lambda f: TrialOutcome(value=float(f["max-num-seqs"]), constraints={}))
    keys = [small.key(f) for f, _ in seen]
    assert len(keys) == small.size and len(set(keys)) == small.size  # all of it, each once
    assert search.duplicates > 0  # TPE came back to points it had: none was measured again
    assert search.states() == {"COMPLETE": small.size, "DUPLICATE": search.duplicates}
    repeats = [t for t in search.study.get_trials() if "duplicate_of" in t.user_attrs]
    measured = {t.number: small.key(search._flags(t.params))  # noqa: SLF001
                for t in search.study.get_trials() if t.state is TrialState.COMPLETE}  # fmt: skip
    for t in repeats:  # each names the trial that measured the point it proposed again
        assert t.state is TrialState.FAIL
        assert measured[t.user_attrs["duplicate_of"]] == small.key(search._flags(t.params))  # noqa: SLF001
    assert search.propose() is None  # nothing left to measure


def test_a_repeat_is_replaced_by_the_nearest_untried_flag_set() -> None:
    """TPE exploiting its best point proposes it again; the search then measures a step from
    it, not a random point across the space."""
    values = [1, 2, 4, 8, 16, 32, 64, 128]
    line = space(max_num_seqs=SearchDimension(values=values))
    search = TpeSearch(line, "maximize", budget=8, seed=0, startup=2)
    tried: list[int] = []
    replaced = 0
    while (proposal := search.propose()) is not None:
        value = int(proposal.flags["max-num-seqs"])
        if proposal.how.startswith("the untried flag set nearest"):
            repeat = next(t for t in reversed(search.study.get_trials())
                          if "duplicate_of" in t.user_attrs)  # fmt: skip
            at = repeat.params["max-num-seqs"]  # numeric values are searched by position
            untried = [i for i, v in enumerate(values) if v not in tried]
            assert abs(values.index(value) - at) == min(abs(i - at) for i in untried)
            replaced += 1
        tried.append(value)
        search.report(proposal, TrialOutcome(value=-abs(value - 16), constraints={}))
    assert replaced == search.duplicates > 0
    assert sorted(tried) == values  # budget = size: each value once


def test_failed_and_gate_missing_trials_are_marked_so_and_never_measured_again() -> None:
    """Before (auto-tune-vllm): a crashed trial was not marked failed, so the sampler kept
    suggesting it. Here a crash is FAIL, a gate miss an infeasible COMPLETE, and neither is
    measured a second time however often the sampler comes back to it."""

    def f(flags: Flags) -> TrialOutcome:
        if flags["max-num-seqs"] == 1:  # vLLM refused these flags
            return TrialOutcome(failed="refused: vLLM exited")
        over = 0.5 if flags["max-num-seqs"] == 2 else -0.5  # TTFT gate missed at 2 sequences
        return TrialOutcome(
            value=float(flags["max-num-seqs"]), constraints={"max_ttft_p99_ms": over}
        )

    search = TpeSearch(SPACE, "maximize", budget=SPACE.size, seed=0)
    seen = run(search, f)
    keys = [SPACE.key(flags) for flags, _ in seen]
    assert len(keys) == len(set(keys)) == SPACE.size
    trials = {t.number: t for t in search.study.get_trials()}
    failed = [t for t in trials.values() if t.state is TrialState.FAIL and "failed" in t.user_attrs]
    repeats = [t for t in trials.values() if "duplicate_of" in t.user_attrs]
    assert all(t.state is TrialState.FAIL for t in repeats) and len(repeats) == search.duplicates
    infeasible = [t for t in trials.values() if t.state is TrialState.COMPLETE
                  and t.constraints["max_ttft_p99_ms"] > 0]  # fmt: skip
    assert len(failed) == 6 and all(t.user_attrs["failed"].startswith("refused") for t in failed)
    assert len(infeasible) == 6 and all(t.user_attrs["feasible"] is False for t in infeasible)
    assert sum(1 for _, o in seen if o.feasible) == 12


def test_grid_measures_every_point_once_in_order() -> None:
    seen = run(GridSearch(SPACE), throughput)
    assert [flags for flags, _ in seen] == list(SPACE.grid())


def test_plan_declares_the_space_objective_and_budget() -> None:
    plan = TunePlan.model_validate({
        "baseline": {"enforce-eager": True},
        "space": {"max-num-seqs": {"values": [4, 8]}, "block-size": {"low": 32, "high": 128, "step": 32}},
        "objective": {"maximize": "goodput_rps"},
        "search": {"seed": 7},
    })  # fmt: skip
    checked = plan.search_space()
    assert checked.size == 8 and plan.search.budget(checked) == 4  # half the space by default
    config = plan.trial_config(3, {"max-num-seqs": 8, "block-size": 64})
    assert config.name == "t03" and config.label() == "t03: `--max-num-seqs 8 --block-size 64`"
    assert config.argv == ["--enforce-eager", "--max-num-seqs", "8", "--block-size", "64"]
    with pytest.raises(UsageError, match="a search needs an objective"):
        plan.model_copy(update={"objective": None}).check_kind()


# --- the command line refuses before anything starts -------------------------------------------


def invoke(tmp_path: Path, *args: str) -> tuple[int, str]:
    base = ["tune", "--adr-dir", str(tmp_path / "adr"), "--state-dir", str(tmp_path / "s")]
    result = CliRunner().invoke(cli, [*base, *args])
    return result.exit_code, result.stderr


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--space", "tensor-parallel-size=1,2", "--maximize", "goodput_rps"],
         "'tensor-parallel-size' is not a tunable flag, so it cannot be searched"),
        (["--space", "max-num-seqs"], "write FLAG=V1,V2,... or FLAG=LOW..HIGH/STEP"),
        (["--space", "max-num-seqs=4,8"], "a search needs an objective: --maximize goodput_rps"),
        (["--space", "max-num-seqs=4,8", "--maximize", "goodput_rps", "--minimize", "ttft_p99_ms"],
         "give --maximize or --minimize, not both"),
        (["--exp", "a=--block-size 32", "--target", "prod-a"], "--target runs a search"),
        (["--restore"], "--restore needs --target NAME"),
        (["--space", "max-num-seqs=4,8", "--maximize", "goodput_rps", "--approved-by", "U2"],
         "--requested-by and --approved-by are for --target"),
    ],
)  # fmt: skip
def test_cli_tune_search_refuses_bad_usage_before_starting_engines(
    tmp_path: Path, args: list[str], why: str
) -> None:
    code, err = invoke(tmp_path, *args)
    assert code == 2, err
    assert why in err
    assert not (tmp_path / "s").exists()  # no engine was started


def settings_file(tmp_path: Path, *, actuator: str | None = None) -> Path:
    path = tmp_path / "ruleloop.toml"
    actuator = actuator or f'kind = "local"\nstate_dir = "{tmp_path / "engines"}"'
    path.write_text(f"""
[access]
apply = ["U1"]
approve = ["U1", "U2"]
[paths]
state = "{tmp_path / "store"}"
[targets.prod-a]
vllm_url = "http://127.0.0.1:9"
[targets.prod-a.actuator]
{actuator}
""")
    return path


GATE = ["--max-ttft-p99-ms", "500"]
SEARCH = ["--space", "max-num-seqs=4,8", "--maximize", "goodput_rps", "--prompt-length", "16"]
PEOPLE = ["--requested-by", "U1", "--approved-by", "U2"]


@pytest.mark.parametrize(
    ("who", "why"),
    [
        ([], "name who asks (--requested-by"),
        (["--requested-by", "U9", "--approved-by", "U2"], "U9 may not request changes to prod-a"),
        (["--requested-by", "U1", "--approved-by", "U7"], "U7 may not approve changes"),
        (
            ["--requested-by", "U1", "--approved-by", "U1"],
            "needs a second person (two-person rule)",
        ),
        (["--requested-by", "U1"], "needs a second person (two-person rule)"),
    ],
)
def test_a_session_on_a_target_is_approved_like_an_apply(
    tmp_path: Path, who: list[str], why: str
) -> None:
    config = settings_file(tmp_path)
    code, err = invoke(tmp_path, *SEARCH, *GATE, "--target", "prod-a", "--config", str(config),
                       *who)  # fmt: skip
    assert code == 2, err
    assert why in err and "Nothing was changed" in err
    assert not (tmp_path / "store").exists()  # nothing was recorded, the target never asked


def test_self_approval_only_where_the_two_person_rule_is_off() -> None:
    def policy(rules: dict[str, object], target: dict[str, object]) -> Policy:
        return Policy(Settings.model_validate({
            "access": {"apply": ["U1"], "approve": ["U1", "U2"]}, "remediation": rules,
            "targets": {"t": {"vllm_url": "http://127.0.0.1:9", **target}},
        }))  # fmt: skip

    relaxed = policy({"allow_self_approval": True}, {})
    assert relaxed.check_tuning(target="t", requested_by="U1", approved_by=[]) == ["U1"]
    assert policy({}, {}).check_tuning(target="t", requested_by="U1",
                                       approved_by=["U1", "U2"]) == ["U2"]  # fmt: skip
    with pytest.raises(NotAllowed, match="second person"):
        policy({"allow_self_approval": True}, {"two_person": True}).check_tuning(
            target="t", requested_by="U1", approved_by=["U1"]
        )


@pytest.mark.parametrize(
    ("actuator", "gates", "why"),
    [
        ('kind = "dry-run"', GATE, "has a dry-run actuator: it changes nothing"),
        (None, [], "needs gates (the constraints every trial is judged by"),
    ],
)
def test_a_target_session_needs_an_actuator_that_changes_something_and_gates(
    tmp_path: Path, actuator: str | None, gates: list[str], why: str
) -> None:
    config = settings_file(tmp_path, actuator=actuator)
    code, err = invoke(tmp_path, *SEARCH, *gates, "--target", "prod-a", "--config", str(config),
                       *PEOPLE)  # fmt: skip
    assert code == 2, err
    assert why in err
    assert not (tmp_path / "store").exists()


def test_one_change_at_a_time_a_session_and_a_remediation_exclude_each_other(
    tmp_path: Path,
) -> None:
    config = settings_file(tmp_path)
    db = Database(f"sqlite:///{tmp_path / 'store' / 'ruleloop.db'}")
    db.create_schema()
    changes, sessions = RemediationRecords(db=db, clock=utc_now), TuneRecords(db=db, clock=utc_now)

    def request() -> int:
        change = ChangeRequest(
            incident_id=None, channel_id=None, adr_id="ADR-20260831-01", target="prod-a",
            user_id="U1", two_person=True, change={"max-num-seqs": 8}, before={},
            after_flags={}, gateway_rules=None, ttl_s=900,
        )  # fmt: skip
        rem, _ = asyncio.run(changes.create(change))
        return rem.id

    def begin(runner: str) -> int:
        before = Deployed(flags={"max-num-seqs": 4}, base_url="http://127.0.0.1:9").to_json()
        began = sessions.begin(
            target="prod-a", requested_by="U1", approved_by=["U2"], plan={}, runner=runner,
            before=before, detail={},
        )  # fmt: skip
        return asyncio.run(began).id

    try:
        pending = request()
        code, err = invoke(tmp_path, *SEARCH, *GATE, "--target", "prod-a", "--config",
                           str(config), *PEOPLE)  # fmt: skip
        assert code == 2, err
        assert (
            f"tuning prod-a was not started: change #{pending} (ADR-20260831-01, pending, "
            "requested by U1) is waiting for approval there"
        ) in err
        with pytest.raises(TargetBusy):  # the store's check, not only the command line's
            begin("here:1:a")
        assert asyncio.run(changes.step(pending, to_state="expired", action="remediation.expired",
                                        detail={}, from_states=["pending"]))  # fmt: skip

        session = begin("here:1:a")
        with pytest.raises(TargetBusy) as busy:
            request()
        text = refusal("ADR-20260831-01", "prod-a", busy.value.holder, None)
        assert text.startswith(
            f"ADR-20260831-01 on prod-a was not requested: tuning session #{session} "
            "(requested by <@U1>) is running there"
        )
        assert "ruleloop tune --target prod-a --restore" in text
        with pytest.raises(TargetBusy):
            begin("there:2:b")  # a second session on the same target
        code, err = invoke(tmp_path, *SEARCH, *GATE, "--target", "prod-a", "--config",
                           str(config), *PEOPLE)  # fmt: skip
        assert f"tuning session #{session} (requested by U1) is running there" in err
    finally:
        db.dispose()


async def test_the_next_bot_restores_a_session_whose_process_died(tmp_path: Path) -> None:
    """What a bot's resume (at start and on its schedule) does with a session nobody runs:
    it takes it over and rolls the target back to the recorded flags, once."""
    async with SseEngine(metrics_pages=PAGES[:1]) as engine:
        targets = {"prod-a": {"vllm_url": engine.base_url, "actuator": {"kind": "dry-run"}}}
        h = harness(tmp_path, slack=None, targets=targets)
        try:
            sessions = TuneRecords(db=h.bot.db, clock=utc_now)
            before = Deployed(flags={"max-num-seqs": 4}, base_url=engine.base_url)
            row = await sessions.begin(
                target="prod-a", requested_by="U1", approved_by=["U2"], plan={},
                before=before.to_json(), runner="gone-host:1:dead", detail={},
            )  # fmt: skip
            assert await sessions.step(row.id, action="tune.trial_started",
                                       owner="gone-host:1:dead", detail={},
                                       trial={"number": 2, "phase": "measuring"})  # fmt: skip
            assert await h.bot.remediation.resume(stale_s=600) == 0  # it beat a moment ago
            assert await h.bot.remediation.resume(stale_s=0) == 1
            assert await h.bot.remediation.resume(stale_s=0) == 0  # restored once
            done = await sessions.get(row.id)
            assert done.state == "restored" and done.trial == {}
            assert done.result["reason"] == "its process stopped during trial 2 (measuring)"
            with h.bot.db.transaction() as s:
                trail = [e.action for e in audit_trail(s)
                         if e.detail.get("tune_session") == row.id]  # fmt: skip
            assert trail == ["tune.started", "tune.trial_started", "tune.resumed",
                             "tune.restoring", "tune.restored"]  # fmt: skip
        finally:
            await h.close()


def test_the_guides_search_plan_loads_and_its_space_is_checked(tmp_path: Path) -> None:
    """docs/tune.md's plan is a plan `ruleloop tune --plan` accepts, as written."""
    text = (Path(__file__).parent.parent / "docs" / "tune.md").read_text()
    (block,) = [b for b in re.findall(r"^```yaml\n(.*?)^```$", text, flags=re.M | re.S)
                if "\nspace:" in b]  # fmt: skip
    shapes.save(long_system_prompt(), tmp_path / "prod.yaml")
    path = tmp_path / "search.yaml"
    path.write_text(block.replace("shape: prod.yaml", f"shape: {tmp_path / 'prod.yaml'}"))
    plan = load_plan(path)
    plan.check_kind()
    checked = plan.search_space()
    assert checked.flags == ["max-num-seqs", "max-num-batched-tokens", "enable-prefix-caching"]
    assert checked.size == 4 * 8 * 2 and plan.search.budget(checked) == 12
    assert plan.objective is not None and plan.objective.metric == "goodput_rps"


def test_without_a_workload_a_target_session_replays_the_targets_own_traffic(
    tmp_path: Path,
) -> None:
    """The shape is captured from the target's /metrics first and every trial replays it."""
    from bot.app.cli.tune_target import _captured

    vllm = Path(__file__).parent / "fixtures" / "vllm-0.32.0"
    pages = [(vllm / "before.prom").read_text()] + [(vllm / "after.prom").read_text()] * 50
    plan = TunePlan.model_validate({"space": {"max-num-seqs": {"values": [4, 8]}},
                                    "objective": {"maximize": "goodput_rps"},
                                    "workload": {"concurrency": 6, "num_requests": 40}})  # fmt: skip
    lines: list[str] = []
    with RecordedMetrics(pages) as engine:
        settings = Settings.model_validate({"targets": {"prod-a": {"vllm_url": engine.base_url}}})
        replay = _captured(plan, spec_name="prod-a", settings=settings, seconds=0.2,
                           runs_dir=tmp_path / "runs", echo=lines.append)  # fmt: skip
    assert replay.workload.shape == tmp_path / "runs" / "workload.yaml"
    shape = shapes.load(tmp_path / "runs" / "workload.yaml")
    assert shape.prompt_tokens.count == 16 and shape.source.startswith(f"metrics {engine.base_url}")
    assert (replay.workload.concurrency, replay.workload.num_requests) == (6, 40)
    assert lines[0].startswith(f"capturing prod-a's workload from {engine.base_url}/metrics")
    with (
        RecordedMetrics(pages[:1] * 50) as idle,
        pytest.raises(UsageError, match="no request finished"),
    ):
        settings = Settings.model_validate({"targets": {"prod-a": {"vllm_url": idle.base_url}}})
        _captured(plan, spec_name="prod-a", settings=settings, seconds=0.2,
                  runs_dir=tmp_path / "idle", echo=lines.append)  # fmt: skip
