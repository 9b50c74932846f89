"""Issue 45 item 3 (item 4 of the reliability faults before it), end to end: `kill -9` of the
process running a change, for every kind of change and at each of its steps, on real processes
sharing one real PostgreSQL.

Replica B (a `ruleloop serve`) is alive throughout. The change runs in another process, killed
with SIGKILL in one step; B finds it silent past `stale_after_s` and takes it over:

- a remediation (/apply-adr and the Approve click, to replica A): killed measuring the
  baseline (approved), applying, in its canary, promoting, or rolling back after a failed
  canary; B rolls it back (one killed before anything was applied is interrupted);
- the live canary stage of a remediation (the target has ``live_stage``): killed in its first
  step, in the second (the first judged: between steps), in the last, or promoting; B goes on
  from the first step not judged and promotes it (killed promoting: B rolls it back, the
  promotion was not recorded);
- a tuning session on the target (`ruleloop tune --target`, a process of its own): killed
  while a trial's flags are being applied, during the trial's canary, or while the trial is
  being restored; B restores what served before the session;
- a drift before-run (replica A's workload-drift job, the only one that runs it: production's
  replicas serve pages of long agent prompts, the ADR in force was measured under chat): killed
  once the flags the ADR's change replaced are PATCHed back onto the canary stage, or while its
  canary measures them there; B restores what served (the ADR's flags).

For each: the change ends in one terminal state, told as one story on the record; the
Deployments' args are exactly what they were (or the promoted ones, where the promotion was
recorded); each Deployment was PATCHed with the change's flags at most once; every silence the
change opened at the (real) Alertmanager is expired. The Kubernetes API is the fake at the wire
(over HTTP), the engine a fake that streams tokens and serves a recorded /metrics page, so the
canary is the real one and passes or fails by the engine's token pace. The drift cases' engine
for production is a server of recorded pages (tests.workload_pages): its capture is what starts
the before-run.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import random
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.change.argv import read_flags
from bot.kernel.config import Settings
from bot.kernel.store import service as store
from bot.kernel.store.db import Database
from bot.kernel.store.models import Remediation, TuneSession
from tests.alertmanager_process import alertmanager as running_alertmanager
from tests.fakes.bot import PAGES
from tests.fakes.clock import FakeTime
from tests.fakes.kube_api import TOKEN, FakeKube, KubeActuators
from tests.fakes.kube_server import KubeServer
from tests.fakes.metrics_server import RecordedMetrics
from tests.fakes.slack_api import FakeSlack
from tests.fakes.sse_engine import SseEngine
from tests.kill_apply import (
    ADR,
    CANARY,
    FAILING_PACE_S,
    PASSING_PACE_S,
    STALE_S,
    Cluster,
    replica_env,
    secret_file,
)
from tests.test_bot_store import postgres  # noqa: F401  (the real PostgreSQL server fixture)
from tests.test_replicas import pg_url  # noqa: F401  (a fresh database on it)
from tests.test_scheduler_workload_drift import record_workload
from tests.workload_pages import chat, vllm_page

pytestmark = [pytest.mark.slow, pytest.mark.faults]
ARGS = ["--model", "/models/llama-3-8b", "--api-key", "sk-secret", "--max-num-batched-tokens",
        "8192"]  # fmt: skip
DEPLOYMENTS = ("vllm", "vllm-canary")
# what the ADR's change sets (tests.kill_apply.ADR)
CHANGE = {"block-size": 32, "enable-chunked-prefill": True, "max-num-batched-tokens": 2048}
# an end far past the test: only an expiry ends a change's silence, never its own end
SILENCE = {"change_s": 3600, "settle_s": 300}
# three short windows; the fake engine's fixed page gives the judge nothing to compare, so each
# step "cannot judge" and the stage allows that of every step: it is promoted unless cut short
LIVE_STAGE = {"steps": 3, "step_s": 3, "interval_s": 1, "inconclusive_limit": 3}
# a search of two trials, each a canary of about 3 s at the passing pace (16 streams of 12
# tokens, 10 ms apart): long enough to be killed in, short enough to reach its restore
TUNE = ["--space", "max-num-seqs=8,16", "--trials", "2", "--maximize", "goodput_rps",
        "--max-ttft-p99-ms", "60000", "--prompt-length", "16", "--output-length", "12",
        "--num-requests", "400", "--concurrency", "16"]  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One kind of change killed in one step, and how it must end."""

    kind: str  # remediation | live_stage | tuning | drift_before_run
    step: str | None  # where its process is killed (None: it is not)
    final: str
    canary_fails: bool = False
    live_judged: int = 0  # the live stage's steps judged when it was killed

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.step or 'no-kill'}"


CASES = [
    Case("remediation", None, "promoted"),
    Case("remediation", "approved", "interrupted"),  # measuring the baseline: nothing applied
    Case("remediation", "applying", "rolled_back"),
    Case("remediation", "canary", "rolled_back"),
    Case("remediation", "promoting", "rolled_back"),
    Case("remediation", "rolling_back", "rolled_back", canary_fails=True),  # A's own rollback
    Case("live_stage", "step-1", "promoted", live_judged=0),
    Case("live_stage", "step-2", "promoted", live_judged=1),  # step 1 judged: between steps
    Case("live_stage", "step-3", "promoted", live_judged=2),  # the last
    Case("live_stage", "promoting", "rolled_back"),  # the promotion was not recorded yet
    Case("tuning", "applying", "restored"),  # the trial's flags going onto the canary stage
    Case("tuning", "measuring", "restored"),  # the trial's canary
    Case("tuning", "restoring", "restored"),  # the trial's rollback
    Case("drift_before_run", "replaced", "restored"),  # the replaced flags PATCHed back on
    Case("drift_before_run", "measuring", "restored"),  # its canary on them
]
RELATIVE = "  max_tpot_p99_ms: 0.5x before\n"  # the ADR's gate: a before-run measures its before
DRIFT = "workload_every_s = 2\nworkload_window_s = 3\n"  # replica A's job (B runs none)


def actuator(tmp_path: Path, *, kube: str, engine: str) -> dict[str, Any]:
    """[targets.tiny.actuator]: the Kubernetes API's fake, over HTTP."""
    return {"kind": "kubernetes", "api_url": kube, "namespace": "inference", "deployment": "vllm",
            "canary_deployment": "vllm-canary", "canary_url": engine,
            "token_file": secret_file(tmp_path, "kube-token", TOKEN), "poll_interval_s": 0.4,
            "rollout_timeout_s": 60}  # fmt: skip


@pytest.fixture
def am(tmp_path: Path) -> Iterator[str]:
    """A real Alertmanager (its receiver is never reached: only silences are read)."""
    config = {"route": {"receiver": "none"}, "receivers": [{"name": "none"}]}
    with running_alertmanager(tmp_path, config) as url:
        yield url


@pytest.fixture
async def cluster(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
    slack: FakeSlack,
    am: str,
    case: Case,
) -> AsyncIterator[Cluster]:
    kube = FakeKube()
    for name in DEPLOYMENTS:
        kube.add_deployment(name, args=ARGS, replicas=2)
    db = Database(pg_url)
    with KubeServer(kube) as api:
        # one recorded page whose generation counter counts what the fake streamed: goodput is
        # the canary's own tokens against the engine's count, as on a real engine
        async with SseEngine(metrics_pages=PAGES[:1], count_generation=True) as engine:
            kubernetes = actuator(tmp_path, kube=api.url, engine=engine.base_url)
            more: dict[str, Any] = {}
            if case.kind == "live_stage":  # the canary's pods: the engine by another name
                canary = engine.base_url.replace("127.0.0.1", "localhost")
                more = {"live_stage": LIVE_STAGE, "canary_replicas": [canary]}
            with contextlib.ExitStack() as stack:
                if case.kind == "drift_before_run":  # production's replicas: agents' pages
                    agents = stack.enter_context(RecordedMetrics(agent_pages()))
                    more = {"replicas": [agents.base_url],
                            "canary": {**CANARY, "drift_before_run": True}}  # fmt: skip
                env = replica_env(tmp_path, engine=engine.base_url, actuator=kubernetes,
                                  pg_url=pg_url, slack=slack,
                                  silence={"alertmanager_url": am, **SILENCE}, **more)  # fmt: skip
                _workload_job(Path(env["RULELOOP_CONFIG"]), "workload_every_s = 0\n")
                c = Cluster(tmp_path=tmp_path, db=db, kube=kube, engine=engine, slack=slack,
                            env=env, am=am)  # fmt: skip
                async with c.survived():
                    yield c
    db.dispose()


def agent_pages(n: int = 400, per_scrape: int = 20) -> list[str]:
    """An engine's /metrics, one page a scrape: ``per_scrape`` more requests of agents behind a
    long system prompt finished at each (prompts of 2,100 to 3,900 tokens; chat() is 64-192)."""
    rng = random.Random(7)
    prompts: list[int] = []
    outputs: list[int] = []
    pages = []
    for _ in range(n):
        prompts += [rng.randint(2100, 3900) for _ in range(per_scrape)]
        outputs += [rng.randint(50, 400) for _ in range(per_scrape)]
        pages.append(vllm_page(prompts=prompts, outputs=outputs, running=3.0,
                               hits=0.3 * sum(prompts), queries=sum(prompts)))  # fmt: skip
    return pages


def _workload_job(config: Path, setting: str) -> None:
    """The config's [scheduler] with ``setting`` (its workload job's interval and window)."""
    text = config.read_text()
    config.write_text(text.replace("[scheduler]\n", "[scheduler]\n" + setting, 1))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_kill_9_at_each_step_of_every_kind_of_change(cluster: Cluster, case: Case) -> None:
    started = time.monotonic()
    if case.kind == "tuning":
        await _tuning_killed(cluster, case)
    elif case.kind == "drift_before_run":
        await _before_run_killed(cluster, case)
    else:
        await _remediation_killed(cluster, case)
    print(f"\n{case.id}: {case.final} in {time.monotonic() - started:.1f} s")


async def _remediation_killed(cluster: Cluster, case: Case) -> None:
    """/apply-adr run by replica A, killed in ``case.step``; B ends it."""
    async with cluster.replica_a(canary_fails=False) as replica:
        rem_id = await cluster.request_and_approve(replica)
        if case.canary_fails:  # its canary, not the baseline before it: half the wait
            await cluster.until_state(rem_id, {"canary"}, timeout=60)
            cluster.engine.token_delay_s = FAILING_PACE_S
        if case.step is not None:
            await _until(cluster, rem_id, case)
            replica.kill_9()
        state = await cluster.until_ended(rem_id, within_s=240)
    in_stage = (case.step or "").startswith("step")  # a live step: the change is in canary
    killed_in = "canary" if in_stage else case.step
    left = LIVE_STAGE["steps"] - case.live_judged
    rem = cluster.ended(rem_id, state, killed_in=killed_in, final=case.final, live_left=left)
    if in_stage:  # B went on from the first step not judged
        resumed = next(e for e in cluster.trail(rem_id) if e.action == "remediation.resumed")
        assert resumed.detail["live_steps_judged"] == case.live_judged, resumed.detail
    if case.kind == "live_stage" and case.final == "promoted":
        lines = rem.result["live"]
        assert [line.split(": ")[0] for line in lines] == ["step 1/3", "step 2/3", "step 3/3"]
    promoted = case.final == "promoted"
    for name in DEPLOYMENTS:
        args = cluster.kube.args(name)
        if promoted:  # the change's flags, the others (the secret too) as they were
            assert read_flags(args) == read_flags(ARGS) | CHANGE, (name, args)
        else:  # rolled back (or never changed): exactly the args it had, secret included
            assert args == ARGS, (name, args)
    # applied at most once: the canary Deployment once (none when killed before applying),
    # the main one only by the promotion
    applied = {name: cluster.applied(name, CHANGE) for name in DEPLOYMENTS}
    if case.step == "applying":  # A may have died before its PATCH
        assert applied["vllm-canary"] <= 1, applied
    else:
        assert applied["vllm-canary"] == int(case.final != "interrupted"), applied
    if case.step == "promoting":  # A may have PATCHed the main Deployment before it died
        assert applied["vllm"] <= 1, applied
    else:
        assert applied["vllm"] == int(promoted), applied
    assert cluster.kube.rolled_out("vllm") and cluster.kube.rolled_out("vllm-canary")
    await cluster.card_says(rem, case.final)
    await _silences_ended(cluster, rem_id)


async def _until(cluster: Cluster, rem_id: int, case: Case) -> None:
    """Until the change is in the step ``case`` kills it in: a state, or a live step's window
    (its record holds the steps judged before it)."""
    if not (case.step or "").startswith("step"):
        await cluster.until_state(rem_id, {case.step or ""}, timeout=60)
        return
    deadline = time.monotonic() + 120
    while True:
        rem = cluster.remediation(rem_id)
        assert rem is not None
        live = rem.result.get("live")
        if rem.state == "canary" and live is not None and len(live) == case.live_judged:
            return
        assert time.monotonic() < deadline, (rem.state, live)
        await asyncio.sleep(0.02)


async def _silences_ended(cluster: Cluster, rem_id: int) -> None:
    """Every silence at the Alertmanager expired, and the record says so of the change's;
    bounded (the survivor expires it just after the change's end), not a timing assertion."""
    deadline = time.monotonic() + 60
    while True:
        rem = cluster.remediation(rem_id)
        assert rem is not None
        on_record = rem.silence is None or bool(rem.silence.get("expired"))
        active = [s for s in cluster.silences() if s["status"]["state"] != "expired"]
        if on_record and not active:
            break
        assert time.monotonic() < deadline, (rem.silence, active)
        await asyncio.sleep(0.1)
    ids = {s["id"] for s in cluster.silences()}
    assert len(ids) <= 1, ids  # at most the one the change opened; none opened twice
    said = [e.action.removeprefix("remediation.") for e in cluster.trail(rem_id)]
    said = [action for action in said if "silence" in action]
    if rem.silence is not None:
        assert ids == {rem.silence["id"]}, (ids, rem.silence)
        assert said == ["silenced", "silence_expired"], said
    else:
        assert said == [] and not ids, (said, ids)


async def _tuning_killed(cluster: Cluster, case: Case) -> None:
    """`ruleloop tune --target` killed in its first trial's ``case.step``; B restores."""
    cluster.engine.token_delay_s = PASSING_PACE_S
    with cluster.tuning(*TUNE) as tune:
        deadline = time.monotonic() + 120
        while True:
            row = cluster.session()
            if row is not None and (row.trial or {}).get("phase") == case.step:
                break
            tune.alive()
            assert time.monotonic() < deadline, row and (row.state, row.trial)
            await asyncio.sleep(0.02)
        tune.kill_9()
    killed = cluster.session()
    assert killed is not None and killed.state == "running", killed and killed.state
    trial = dict(killed.trial)
    assert trial["number"] == 1 and trial["phase"] == case.step, trial
    row = await _until_session_ended(cluster, killed.id, within_s=120)
    assert row.state == case.final, (row.state, row.result)
    assert row.trial == {} and row.runner != killed.runner
    story = [e.action.removeprefix("tune.") for e in cluster.session_trail(row.id)]
    phases = {"applying": [], "measuring": ["trial_measuring"],
              "restoring": ["trial_measuring", "trial_restoring"]}[case.step or ""]  # fmt: skip
    assert story == ["started", "trial_started", *phases, "resumed", "restoring", "restored"]
    resumed = next(e for e in cluster.session_trail(row.id) if e.action == "tune.resumed")
    assert resumed.detail.get("was_run_by") == killed.runner, resumed.detail
    for name in DEPLOYMENTS:  # what served before the session, exactly
        assert cluster.kube.args(name) == ARGS, (name, cluster.kube.args(name))
    assert cluster.kube.rolled_out("vllm") and cluster.kube.rolled_out("vllm-canary")
    # the trial's flags went onto the canary stage at most once (none: killed before its
    # PATCH), never onto the main Deployment
    flags = trial["flags"]
    assert cluster.applied("vllm-canary", flags) <= 1 and cluster.applied("vllm", flags) == 0
    assert cluster.silences() == []  # a session silences nothing


async def _until_session_ended(
    cluster: Cluster, session_id: int, *, within_s: float
) -> TuneSession:
    deadline = time.monotonic() + STALE_S + within_s
    while True:
        row = cluster.session()
        assert row is not None and row.id == session_id, row and row.id
        if row.state not in ("running", "restoring"):
            return row
        assert time.monotonic() < deadline, (row.state, row.trial)
        await asyncio.sleep(0.05)


async def _before_run_killed(cluster: Cluster, case: Case) -> None:
    """The drift job's before-run on replica A, killed in ``case.step``; B restores."""
    fixed = await _promoted(cluster)  # what serves: the ADR's flags
    patched = len(cluster.kube.patches())
    cluster.engine.token_delay_s = PASSING_PACE_S
    config = cluster.tmp_path / "ruleloop-a.toml"
    b = Path(cluster.env["RULELOOP_CONFIG"]).read_text()  # B's: no workload job
    config.write_text(b.replace("workload_every_s = 0\n", DRIFT, 1))
    env = {**cluster.env, "RULELOOP_CONFIG": str(config)}
    async with cluster.replica_a(canary_fails=False, env=env) as replica:
        deadline = time.monotonic() + 120
        streams = cluster.engine.streams
        while True:
            row = cluster.session()
            # exactly the replaced flags: the ones the ADR's change added are gone too
            replaced = read_flags(cluster.kube.args("vllm-canary")) == read_flags(ARGS)
            if row is None or not replaced:
                streams = cluster.engine.streams
            elif case.step == "replaced" or cluster.engine.streams > streams:
                break  # the replaced flags on the canary stage; measured, when asked
            assert replica.proc.proc.poll() is None, replica.proc.log.read_text()[-3000:]
            assert time.monotonic() < deadline, row and (row.state, row.kind)
            await asyncio.sleep(0.02)
        replica.kill_9()
    killed = cluster.session()
    assert killed is not None and killed.kind == "drift_before_run", killed and killed.kind
    assert killed.state == "running" and killed.plan["drift_before_run"] == ADR, killed.plan
    row = await _until_session_ended(cluster, killed.id, within_s=120)
    assert row.state == case.final, (row.state, row.result)
    assert row.runner != killed.runner
    story = [e.action.removeprefix("tune.") for e in cluster.session_trail(row.id)]
    assert story == ["started", "resumed", "restoring", "restored"], story
    for name in DEPLOYMENTS:  # what served before the before-run: the ADR's flags, exactly
        assert cluster.kube.args(name) == fixed, (name, cluster.kube.args(name))
    assert cluster.kube.rolled_out("vllm") and cluster.kube.rolled_out("vllm-canary")
    # the replaced flags went back onto the canary stage once, never onto the main Deployment
    assert len(cluster.kube.patches()) > patched
    before = read_flags(ARGS)
    assert cluster.applied("vllm-canary", before) == 1 and cluster.applied("vllm", before) == 0
    # as they served before the change: its added flags removed, the other args (a secret) kept
    staged = [p.body["spec"]["template"]["spec"]["containers"][0]["args"]
              for p in cluster.kube.patches("vllm-canary")[1:]]  # fmt: skip
    assert staged == [ARGS, fixed], staged
    assert cluster.silences() == []  # a before-run silences nothing


async def _promoted(cluster: Cluster) -> list[str]:
    """The ADR's change made and promoted on tiny (by the actuator, against the fake, as a
    change would), recorded as replacing ARGS; the ADR measured under chat, its gate relative."""
    settings = Settings.load({}, path=Path(cluster.env["RULELOOP_CONFIG"]))
    actuators = KubeActuators(cluster.kube, FakeTime())
    try:
        actuator = actuators("tiny", settings.targets["tiny"])
        replaced = await actuator.current()
        await actuator.apply(CHANGE)
        await actuator.promote(CHANGE)
    finally:
        await actuators.aclose()
    fixed = cluster.kube.args("vllm")
    assert read_flags(fixed) == read_flags(ARGS) | CHANGE, fixed
    assert cluster.kube.args("vllm-canary") == fixed
    _measured_under_chat(Path(settings.paths.adr))
    now = dt.datetime.now(dt.UTC)
    with cluster.db.transaction() as s:
        incident = store.create(s, key="k", source="slash", title="t", target="tiny", labels={},
                                at=now)  # fmt: skip
        s.add(Remediation(incident_id=incident.id, adr_id=ADR, target="tiny", requested_by="U1",
                          state="promoted", approvals_needed=1, before=replaced.to_json(),
                          result={"before_numbers": {"tpot_p99_ms": 20.0}}, created_at=now,
                          updated_at=now))  # fmt: skip
    return fixed


def _measured_under_chat(adr_dir: Path) -> None:
    """The ADR as if measured under chat (its workload), its gate relative to a before."""
    record_workload(adr_dir, chat())
    path = next(adr_dir.glob(f"{ADR}-*.md"))
    text = path.read_text()
    start = text.index("gates:\n") + len("gates:\n")
    end = start
    while text.startswith("  ", end):  # the gates block: its indented lines
        end = text.index("\n", end) + 1
    path.write_text(text[:start] + RELATIVE + text[end:])
