"""`ruleloop tune` searching on real vLLM engines (CPU): on fresh local engines, and on a target
through its local actuator, where every trial is rolled back and the flags it found serve again
at the end, also after the session's process is killed with SIGKILL mid-trial and a new
process finishes the restore.

One engine serves as the target of this module (its own port and state dir; the shared test
engines are never restarted). Trials are short: a tiny dummy-weight model, a canary of a few
dozen requests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import select

from bot.adr.parse import load
from bot.adr.validate import validate
from bot.app.cli import cli
from bot.change.actuators.local import process_argv
from bot.change.argv import read_flags
from bot.engine.model import SERVED_MODEL_NAME
from bot.engine.process import EngineInfo, EngineManager, free_port
from bot.kernel.store.db import Database
from bot.kernel.store.models import AuditEntry, TuneSession
from bot.tune.matrix import RECOMMENDED
from tests.fakes.bot import ROOT

pytestmark = [pytest.mark.engine, pytest.mark.slow]
LAUNCH = ["--enforce-eager", "--max-num-seqs", "4"]  # what the target serves before a session
OUTPUT = 128
WORKLOAD = ["--prompt-length", "32", "--output-length", str(OUTPUT), "--num-requests", "24",
            "--concurrency", "8"]  # fmt: skip


def one_request_s(engine: EngineInfo) -> float:
    """How long one request of the workload takes alone on this machine, now (a warm engine)."""
    body = {"model": SERVED_MODEL_NAME, "prompt": [100] * 32, "max_tokens": OUTPUT,
            "ignore_eos": True}  # fmt: skip
    with httpx.Client(base_url=engine.base_url, timeout=300) as client:
        client.post("/v1/completions", json=body).raise_for_status()
        started = time.perf_counter()
        for _ in range(3):
            client.post("/v1/completions", json=body).raise_for_status()
        return (time.perf_counter() - started) / 3


def run_json(path: Path) -> dict[str, object]:
    return dict(json.loads(path.read_text()))


def test_search_on_fresh_engines_finds_the_better_value_and_marks_the_gate_misses(
    engine: EngineInfo, engine_manager: EngineManager, tmp_path: Path
) -> None:
    """Four flag sets, three trials: one sequence per step is worse by construction (and
    misses the TTFT gate); the search must recommend 8, mark each miss, measure none twice.

    The gate is this machine's own: at one sequence per step, 8 streams wait for the 7
    requests ahead of theirs, a TTFT p99 of about 7 requests' time; at 8 sequences one step's.
    A TTFT limit of 3.5 requests' time, measured alone just before, separates them on a fast
    machine and a loaded one alike."""
    gate_ms = round(3.5 * one_request_s(engine) * 1000, 1)
    adr_dir = tmp_path / "adr"
    result = CliRunner().invoke(cli, [
        "tune", "--title", "Search smoke test", "--date", "2026-12-02",
        "--baseline", "--enforce-eager",
        "--space", "max-num-seqs=1,8", "--space", "enable-prefix-caching=true,false",
        "--maximize", "goodput_rps", "--trials", "3", "--search-seed", "1",
        *WORKLOAD, "--max-ttft-p99-ms", str(gate_ms), "--start-timeout", "600",
        "--adr-dir", str(adr_dir), "--state-dir", str(engine_manager.state_dir),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output + result.stderr
    draft_path = adr_dir / "drafts" / "ADR-20261202-01-search-smoke-test.md"
    draft = load(draft_path)
    assert validate(adr_dir) == []
    runs = sorted((adr_dir / "drafts" / "ADR-20261202-01-search-smoke-test.runs").glob("*.json"))
    assert [p.name for p in runs] == ["01-t01.json", "02-t02.json", "03-t03.json"]
    trials = [run_json(p) for p in runs]
    flag_sets = [json.dumps(t["engine_args"], sort_keys=True) for t in trials]
    assert len(set(flag_sets)) == 3  # no flag set measured twice
    assert len(draft.matrix) == 3  # every trial is a row of the matrix
    seqs = [t["engine_args"]["max-num-seqs"] for t in trials]  # type: ignore[index]
    assert seqs.count(1) >= 1 and seqs.count(8) >= 1  # 3 of 4 points: both values are there

    for number, (row, trial) in enumerate(zip(draft.matrix, trials, strict=True), start=1):
        said = next(line for line in result.stderr.splitlines()
                    if line.startswith(f"[trial {number}/3] t0{number}: goodput_rps "))  # fmt: skip
        if trial["engine_args"]["max-num-seqs"] == 1:  # type: ignore[index]
            assert row.verdict.startswith("不达标 (fail: TTFT p99 "), row.verdict
            assert "misses the gates (infeasible)" in said, said
        else:
            assert row.verdict in (RECOMMENDED, "达标 (pass)"), row.verdict
            assert "meets the gates" in said, said
    picked = [row for row in draft.matrix if row.verdict == RECOMMENDED]
    assert len(picked) == 1
    best = trials[draft.matrix.index(picked[0])]
    assert best["engine_args"]["max-num-seqs"] == 8  # type: ignore[index]
    scores = [t["score"] for t in trials if t["engine_args"]["max-num-seqs"] == 8]  # type: ignore[index]
    assert best["score"] == max(scores)  # type: ignore[type-var]
    assert draft.fix.engine_args == best["engine_args"]
    text = draft_path.read_text(encoding="utf-8")
    assert "searched 4 flag sets with Optuna's TPE sampler (seed 1" in text
    assert "none was measured twice" in text
    assert f"--max-ttft-p99-ms {gate_ms:g}" in text  # the gates are the release gate
    assert draft.workload is not None and draft.workload.arrivals.concurrency == 8
    for trial in trials:  # every engine the search started was stopped again
        endpoint = trial["report"]["workload"]["endpoint"]  # type: ignore[index]
        port = urlsplit(endpoint).port
        assert port is not None and engine_manager.find(port) is None


# --- on a target ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineManager, int, Path]]:
    """The target: a local engine with its own state dir, and the bot's config naming it."""
    root = tmp_path_factory.mktemp("tune-target")
    manager = EngineManager(state_dir=root / "engines")  # RULELOOP_ENGINE_CPU_LIMIT applies
    port = free_port()
    manager.start(port=port, flags=LAUNCH, timeout_s=600)
    config = root / "ruleloop.toml"
    config.write_text(f"""
[access]
apply = ["U1"]
approve = ["U1", "U2"]
[paths]
state = "{root / "store"}"
[remediation]
heartbeat_s = 1
stale_after_s = 5
[targets.tiny]
vllm_url = "http://127.0.0.1:{port}"
[targets.tiny.actuator]
kind = "local"
state_dir = "{root / "engines"}"
start_timeout_s = 600
""")
    try:
        yield manager, port, config
    finally:
        manager.stop(port)


def serving(manager: EngineManager, port: int) -> dict[str, object]:
    """The tunable flags of the engine on ``port``, read from its process's command line."""
    info = manager.find(port)
    assert info is not None, "the target's engine is gone"
    argv = process_argv(info.pid)
    assert argv is not None
    return dict(read_flags(argv))


def sessions(config: Path) -> tuple[list[TuneSession], list[AuditEntry]]:
    path = config.parent / "store" / "ruleloop.db"
    if not path.exists():  # no session has run on this target yet: nothing recorded
        return [], []
    db = Database(f"sqlite:///{path}")
    try:
        with db.transaction() as s:
            rows = list(s.scalars(select(TuneSession).order_by(TuneSession.id)))
            trail = [e for e in s.scalars(select(AuditEntry).order_by(AuditEntry.id))
                     if e.action.startswith("tune.")]  # fmt: skip
            return rows, trail
    finally:
        db.dispose()


def target_args(config: Path, adr_dir: Path, *extra: str) -> list[str]:
    return ["tune", "--target", "tiny", "--config", str(config), "--adr-dir", str(adr_dir),
            "--requested-by", "U1", "--approved-by", "U2", "--date", "2026-12-02",
            "--maximize", "goodput_rps", "--max-ttft-p99-ms", "60000", *extra]  # fmt: skip


def test_a_session_on_a_target_rolls_back_every_trial_and_restores_its_flags(
    target: tuple[EngineManager, int, Path], tmp_path: Path
) -> None:
    manager, port, config = target
    before = serving(manager, port)
    assert before == {"enforce-eager": True, "max-num-seqs": 4}
    result = CliRunner().invoke(cli, target_args(
        config, tmp_path / "adr", "--title", "Target smoke test",
        # 48: vLLM's CPU attention refuses it (the trial fails); 64 serves
        "--space", "block-size=48,64", "--trials", "2",
        "--prompt-length", "32", "--output-length", "16", "--num-requests", "16",
    ))  # fmt: skip
    assert result.exit_code == 0, result.output + result.stderr
    assert serving(manager, port) == before  # what it found serves again
    rows, trail = sessions(config)
    assert [(r.state, r.requested_by, r.approved_by) for r in rows] == [("restored", "U1", ["U2"])]
    assert rows[0].before["flags"] == before and rows[0].trial == {}
    draft_path = next((tmp_path / "adr" / "drafts").glob("*-target-smoke-test.md"))
    draft = load(draft_path)
    verdicts = {r.config.split(":")[1].strip(" `"): r.verdict for r in draft.matrix}
    assert verdicts["--block-size 48"].startswith("引擎拒绝 (refused by vLLM)"), verdicts
    assert verdicts["--block-size 64"] == RECOMMENDED
    assert draft.fix.engine_args == {"block-size": 64}
    assert "each trial rolled back before the next" in draft_path.read_text(encoding="utf-8")
    # the record: every trial written before it changed the target and after it was put back
    expected = ["tune.started"]
    for row in draft.matrix:
        measured = not row.verdict.startswith("引擎拒绝")
        expected += ["tune.trial_started", *(["tune.trial_measuring"] if measured else []),
                     "tune.trial_restoring", "tune.trial_ended"]  # fmt: skip
    assert [e.action for e in trail] == [*expected, "tune.restoring", "tune.restored"]


def test_kill_9_mid_trial_then_a_new_process_restores_the_target(
    target: tuple[EngineManager, int, Path], tmp_path: Path
) -> None:
    manager, port, config = target
    before = serving(manager, port)
    started = len(sessions(config)[0])
    argv = [sys.executable, "-c", "from bot.app.cli import main; main()", *target_args(
        config, tmp_path / "adr", "--title", "Killed", "--space", "max-num-seqs=8,16",
        "--trials", "2", "--prompt-length", "32", "--output-length", "32",
        "--num-requests", "5000",  # a long canary: the kill lands while it runs
    )]  # fmt: skip
    log = (tmp_path / "killed.log").open("w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 900  # a bound for a loaded box, not a timing assertion
        while True:
            rows = sessions(config)[0][started:]
            if rows and rows[0].trial.get("phase") == "measuring":
                break
            assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the trial never reached its canary"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)  # no shutdown, no restore of its own
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    trial_flags = rows[0].trial["flags"]
    assert serving(manager, port) == {**before, **trial_flags} != before  # left mid-trial
    assert rows[0].state == "running"

    restore = subprocess.run(
        [sys.executable, "-c", "from bot.app.cli import main; main()", "tune", "--target", "tiny",
         "--restore", "--config", str(config)],
        capture_output=True, text=True, cwd=ROOT, timeout=900,
    )  # fmt: skip
    assert restore.returncode == 0, restore.stdout + restore.stderr
    assert "stopped during trial 1 (measuring): restoring it" in restore.stderr
    assert serving(manager, port) == before
    rows, trail = sessions(config)
    killed = rows[started]
    assert killed.state == "restored" and killed.trial == {}
    story = [e.action for e in trail if e.detail.get("tune_session") == killed.id]
    assert story == ["tune.started", "tune.trial_started", "tune.trial_measuring",
                     "tune.resumed", "tune.restoring", "tune.restored"]  # fmt: skip
    again = subprocess.run(
        [sys.executable, "-c", "from bot.app.cli import main; main()", "tune", "--target", "tiny",
         "--restore", "--config", str(config)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert again.returncode == 2 and "nothing to restore" in again.stderr
