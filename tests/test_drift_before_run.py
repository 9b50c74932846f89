"""The workload-drift job's before-run (issue 34 item 1) in a real bot, without an engine: when
production's workload drifts, the flags an in-force ADR's change replaced go back on the
target's canary stage (the real KubernetesActuator against the fake Kubernetes API at the wire),
the canary replays the live shape there (the before), the serving flags are put back, and the
ADR's 'Nx before' gates are judged against that before. /metrics is served at the wire
(``Traffic``); the canary gate is the one thing replaced (``StageCanary``: numbers by the URL it
measures); the restore's completion goes to a real HTTP server (``SseEngine``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import select

from bot.adr.models import AdrGates
from bot.adr.workload.shape import WorkloadShape
from bot.canary.verdict import gates_from, judged
from bot.change.actuators.base import Actuator, Deployed
from bot.change.argv import read_flags
from bot.kernel.config import CanarySpec, Settings
from bot.kernel.store import service as store
from bot.kernel.store.models import Remediation, TuneSession
from bot.kernel.store.readings import ROLLBACK_FAILED as FAILED
from bot.remediation.gate import GateRun
from tests import store_reads
from tests.fakes.bot import Harness, harness
from tests.fakes.clock import FakeTime
from tests.fakes.kube_api import FakeKube, KubeActuators
from tests.fakes.slack_api import FakeSlack
from tests.fakes.sse_engine import SseEngine
from tests.test_scheduler_workload_drift import (
    ADR,
    Traffic,
    incidents,
    record_workload,
    set_gates,
    tick,
)
from tests.workload_pages import chat

VLLM_URL = "http://10.0.0.5:8000"  # production: the after-run replays there without a before-run
REPLACED = ["--model", "/models/llama-3-8b", "--max-num-batched-tokens", "8192"]
FIX = ["--model", "/models/llama-3-8b", "--max-num-batched-tokens", "2048"]  # the ADR's change
# a change that also added flags (the args as the actuator's apply writes them)
FIX_ADDING = [*FIX, "--block-size", "32", "--enable-chunked-prefill"]
OLD_BEFORE = {"ttft_p99_ms": 4500.0, "tpot_p99_ms": 1923.4}  # the change's own before-run
RELATIVE = "  max_tpot_p99_ms: 0.5x before\n"
NOT_RUN = "max_tpot_p99_ms 0.5x before: the before-run on the live shape did not run: "


class StageCanary:
    """The canary gate without an engine: TPOT p99 by the flags the engine it measures runs
    (the canary stage on the replaced flags: the before-run; on the fix: the after-run, on the
    same engine); it records each call and the flags the canary Deployment ran meanwhile."""

    def __init__(self, kube: FakeKube, canary_url: str) -> None:
        self.tpot_p99_ms = {"replaced": 80.0, "fix": 27.7}
        self.calls: list[tuple[str, AdrGates, WorkloadShape | None, list[str]]] = []
        self.refuse_patches_after = False  # the API refuses PATCHes from the first measurement on
        self._kube = kube

    async def __call__(
        self,
        base_url: str,
        spec: CanarySpec,
        gates: AdrGates,
        *,
        shape: Any = None,
        **judging: Any,
    ) -> GateRun:
        deployment = "vllm" if base_url == VLLM_URL else "vllm-canary"
        serving = "replaced" if self._kube.args(deployment) == REPLACED else "fix"
        self.calls.append((base_url, gates, shape, self._kube.args("vllm-canary")))
        if self.refuse_patches_after:
            self._kube.forbidden.add("patch")
        report = {"ttft_ms": {"p99": 180.0}, "tpot_ms": {"p99": self.tpot_p99_ms[serving]},
                  "goodput_ratio": 0.99, "kv_fragmentation": {"observed": 0.12},
                  "requests": {"total": 32, "failed": 0}}  # fmt: skip
        return judged(report, gates_from(gates))


@dataclass
class Stage:
    """A bot whose prod-a has a canary Deployment, the ADR's change promoted on both."""

    h: Harness
    kube: FakeKube
    canary: StageCanary
    traffic: Traffic
    slack: FakeSlack
    replaced: Deployed  # what served before the change (the actuator's record)
    canary_url: str
    patches_before: int  # PATCHes the setup made (the change's apply and promote)

    def new_patches(self, name: str | None = None) -> list[Any]:
        return self.kube.patches(name)[self.patches_before if name is None else 0 :]

    def promote(self, before_numbers: dict[str, float] | None = None) -> None:
        """The seed ADR put in force on prod-a by a change recorded as replacing REPLACED."""
        with self.h.bot.db.transaction() as s:
            incident = store.create(s, key="k", source="slash", title="t", target="prod-a",
                                    labels={}, at=self.h.wall.now())  # fmt: skip
            s.add(Remediation(incident_id=incident.id, adr_id=ADR, target="prod-a",
                              requested_by="U1", state="promoted", approvals_needed=1,
                              before=self.replaced.to_json(),
                              result={"before_numbers": before_numbers or OLD_BEFORE},
                              created_at=self.h.wall.now(), updated_at=self.h.wall.now()))  # fmt: skip

    def sessions(self) -> list[TuneSession]:
        with self.h.bot.db.transaction() as s:
            return list(s.scalars(select(TuneSession)))

    def actions(self) -> list[str]:
        with self.h.bot.db.transaction() as s:
            trail = store_reads.audit_trail(s)
            return [e.action for e in trail if e.action.startswith("tune.") or e.action == FAILED]

    def thread(self) -> str:
        """The drift thread's report (what moved, and the gates under the live shape)."""
        posted = [str(c.args["text"]) for c in self.slack.of("chat.postMessage")]
        return next(text for text in reversed(posted) if "What moved:" in text)

    def offered(self) -> str:
        """The thread's last message: the next step offered, with its button (or "")."""
        last = self.slack.of("chat.postMessage")[-1].args
        return str(last.get("blocks", "")) if "Next step" in str(last.get("text")) else ""


def kube_target(canary_url: str, **canary: Any) -> dict[str, Any]:
    actuator = {"kind": "kubernetes", "namespace": "inference", "deployment": "vllm",
                "canary_deployment": "vllm-canary", "canary_url": canary_url,
                "token_file": None, "ca_file": None}  # fmt: skip
    return {"vllm_url": VLLM_URL, "actuator": actuator, "canary": canary}


async def changed_by_the_adr(
    kube: FakeKube, actuators: KubeActuators, h: Harness, fix: list[str]
) -> Deployed:
    """The ADR's change made for real (apply on the canary stage, then promote); what served
    before it, as the actuator recorded it."""
    actuator: Actuator = actuators("prod-a", h.bot.flows.settings.targets["prod-a"])
    replaced = await actuator.current()
    await actuator.apply(read_flags(fix))
    await actuator.promote(read_flags(fix))
    assert kube.args("vllm") == kube.args("vllm-canary") == fix
    return replaced


@pytest.fixture
async def stage(
    tmp_path: Path, slack: FakeSlack, request: pytest.FixtureRequest
) -> AsyncIterator[Stage]:
    fix = getattr(request, "param", FIX)  # the args the ADR's change left serving
    kube = FakeKube()
    kube.add_deployment("vllm", args=REPLACED, replicas=2)
    kube.add_deployment("vllm-canary", args=REPLACED, replicas=1)
    actuators = KubeActuators(kube, FakeTime())  # rollouts poll without waiting
    traffic = Traffic()
    async with SseEngine() as engine:  # the canary stage answers the restore's completion
        canary = StageCanary(kube, engine.base_url)
        scheduler = {"workload_every_s": 300, "workload_window_s": 60,
                     "targets": {"prod-a": {"adrs": [ADR]}}}  # fmt: skip
        h = harness(tmp_path, slack=slack, scheduler=scheduler, transport=traffic.transport(),
                    targets={"prod-a": kube_target(engine.base_url, drift_before_run=True)},
                    bot_options={"gate": canary, "actuator_for": actuators})  # fmt: skip
        try:
            record_workload(Path(h.bot.flows.settings.paths.adr), chat())
            set_gates(h, RELATIVE)
            replaced = await changed_by_the_adr(kube, actuators, h, fix)
            yield Stage(h, kube, canary, traffic, slack, replaced, engine.base_url,
                        patches_before=len(kube.patches()))  # fmt: skip
        finally:
            await h.close()
            await actuators.aclose()


async def test_the_fix_still_helps_against_a_before_on_the_live_shape(stage: Stage) -> None:
    stage.promote()  # the change's own before-run: TPOT p99 1,923.4 ms, on the incident's traffic
    stage.traffic.kind = "agents"
    drift = await tick(stage.h)
    assert drift.detail.get("opened"), drift.detail
    assert drift.detail["revalidated"] == [f"{ADR}: gates hold"]

    before, after = stage.canary.calls
    (url, gates, before_shape, canary_args) = before
    assert url == stage.canary_url and gates.is_empty()  # measured, judged by nothing
    assert canary_args == REPLACED  # the canary stage ran the replaced flags while measured
    (url, gates, after_shape, canary_args) = after
    assert url == stage.canary_url and canary_args == FIX  # the same engine, the fix put back
    assert gates.max_tpot_p99_ms == pytest.approx(40.0)  # 0.5 x 80 ms, not 0.5 x 1,923.4 ms
    assert before_shape is not None and before_shape == after_shape  # like for like
    assert before_shape.prompt_tokens.p50 > 2000  # the live shape, not the ADR's

    text = stage.thread()
    assert ":white_check_mark: Under it the gates still hold" in text
    assert f"TPOT p99 27.7ms (gate ≤ 40ms, {ADR})" in text
    assert (
        f":leftwards_arrow_with_hook: 'before' above is {ADR}'s before on the same live traffic: "
        "--max-num-batched-tokens=8192 (the flags its change replaced) on the canary stage, "
        "then put back: "
    ) in text
    assert "TPOT p99 80.0 ms" in text.split(":leftwards_arrow_with_hook:", 1)[1]
    assert "1,923.4" not in text and "961.7" not in text

    # put back: the canary stage serves the fix again; production was never touched
    assert stage.kube.args("vllm-canary") == FIX and stage.kube.rolled_out("vllm-canary")
    assert stage.kube.args("vllm") == FIX and len(stage.kube.patches("vllm")) == 1  # promote
    assert [p.path.rsplit("/", 1)[1] for p in stage.new_patches()] == ["vllm-canary"] * 2
    (session,) = stage.sessions()
    assert (session.target, session.state) == ("prod-a", "restored")
    assert session.approved_by == ["[targets.prod-a.canary] drift_before_run"]
    assert stage.actions() == ["tune.started", "tune.restoring", "tune.restored"]


@pytest.mark.parametrize("stage", [FIX_ADDING], indirect=True)
async def test_the_before_serves_without_the_flags_the_change_added(stage: Stage) -> None:
    """The change set --max-num-batched-tokens 2048 and added --block-size 32 and
    --enable-chunked-prefill: the before is the args it replaced, not 8192 with its additions."""
    stage.promote()
    stage.traffic.kind = "agents"
    drift = await tick(stage.h)
    assert drift.detail["revalidated"] == [f"{ADR}: gates hold"], drift.detail

    (_, _, _, during), (_, _, _, after) = stage.canary.calls
    assert during == REPLACED  # measured on exactly the replaced args: no flag of the change
    assert after == FIX_ADDING  # the after-run: the same engine, the change's args back
    # the PATCHes of the canary Deployment: the replaced args, then exactly the change's again
    patched = [p.body["spec"]["template"]["spec"]["containers"][0]["args"]
               for p in stage.new_patches()]  # fmt: skip
    assert patched == [REPLACED, FIX_ADDING]
    assert [p.path.rsplit("/", 1)[1] for p in stage.new_patches()] == ["vllm-canary"] * 2
    assert stage.kube.args("vllm-canary") == stage.kube.args("vllm") == FIX_ADDING
    assert stage.kube.rolled_out("vllm-canary")
    text = stage.thread()
    assert (
        "--max-num-batched-tokens=8192 without --block-size --enable-chunked-prefill "
        "(the flags its change replaced) on the canary stage"
    ) in text
    (session,) = stage.sessions()
    assert session.state == "restored" and session.plan["flags"] == read_flags(REPLACED)


async def test_the_fix_that_stopped_helping_fails_its_gate(stage: Stage) -> None:
    stage.promote()
    stage.canary.tpot_p99_ms["replaced"] = 30.0  # the old flags do as well on this traffic
    stage.traffic.kind = "agents"
    drift = await tick(stage.h)
    failing = f"{ADR}: gates fail: TPOT p99 27.7ms > 15ms"
    assert drift.detail["revalidated"] == [failing]
    (incident,) = [i for i in incidents(stage.h) if i.source == "scheduler"]
    assert incident.title.endswith(f"; under it {failing}")
    assert incident.labels["severity"] == "warning"
    text = stage.thread()
    assert ":x: Under it the gates fail" in text and "hold" not in text.split("What moved:")[1]
    # the next step: a re-tune under the live shape, for an approver to start (bot.tune.retune)
    offered = stage.offered()
    assert "Re-tune on the live traffic" in offered and "incident_retune" in offered
    assert f":x: TPOT p99 27.7ms (gate ≤ 15ms, {ADR})" in text
    assert stage.kube.args("vllm-canary") == FIX


@pytest.mark.parametrize("state", ["canary", "applying"])
async def test_a_change_in_flight_on_the_target_changes_no_flags(stage: Stage, state: str) -> None:
    stage.promote()
    with stage.h.bot.db.transaction() as s:  # another change runs on prod-a now
        incident = store.create(s, key="k2", source="slash", title="t2", target="prod-a",
                                labels={}, at=stage.h.wall.now())  # fmt: skip
        rem = Remediation(incident_id=incident.id, adr_id=ADR, target="prod-a",
                          requested_by="U1", state=state, approvals_needed=1,
                          created_at=stage.h.wall.now(), updated_at=stage.h.wall.now())  # fmt: skip
        s.add(rem)
        s.flush()
        busy = rem.id
    stage.traffic.kind = "agents"
    drift = await tick(stage.h)
    assert stage.new_patches() == [] and stage.canary.calls == []
    assert stage.sessions() == []
    assert drift.detail["revalidated"] == [
        f"{ADR}: judged nothing; not judged: {NOT_RUN}change #{busy} ({ADR}, {state}) is in "
        "flight on prod-a"
    ]
    assert "hold" not in stage.thread().split("What moved:")[1]


async def test_without_a_change_record_the_replaced_flags_are_unknown(stage: Stage) -> None:
    # the ADR is in force only because [scheduler.targets.prod-a] adrs lists it
    stage.traffic.kind = "agents"
    drift = await tick(stage.h)
    why = f"no change on prod-a records which flags {ADR} replaced"
    assert drift.detail["revalidated"] == [f"{ADR}: judged nothing; not judged: {NOT_RUN}{why}"]
    assert stage.new_patches() == [] and stage.canary.calls == [] and stage.sessions() == []
    assert why in stage.thread()


async def test_an_actuator_that_cannot_say_what_serves_is_not_judged(stage: Stage) -> None:
    stage.promote()
    stage.kube.forbidden.add("get")  # the service account may no longer read the Deployment
    stage.traffic.kind = "agents"
    drift = await tick(stage.h)
    (summary,) = drift.detail["revalidated"]  # the period posts its thread, not a stack trace
    assert summary.startswith(
        f"{ADR}: judged nothing; not judged: {NOT_RUN}the actuator could not say what serves: "
    ), summary
    assert "forbidden" in summary
    assert stage.new_patches() == [] and stage.canary.calls == [] and stage.sessions() == []
    assert "hold" not in stage.thread().split("What moved:")[1]


async def test_a_refused_patch_is_not_judged_and_the_fix_serves(stage: Stage) -> None:
    stage.promote()
    stage.kube.forbidden.add("patch")  # the service account may no longer patch
    stage.traffic.kind = "agents"
    drift = await tick(stage.h)
    (summary,) = drift.detail["revalidated"]
    assert summary.startswith(f"{ADR}: judged nothing; not judged: {NOT_RUN}")
    assert "forbidden" in summary
    assert stage.canary.calls == []
    assert stage.kube.args("vllm-canary") == FIX
    (session,) = stage.sessions()
    assert session.state == "restored"
    assert stage.actions() == ["tune.started", "tune.restoring", "tune.restored"]


async def test_a_rollout_that_never_gets_ready_is_not_judged_and_the_fix_is_put_back(
    stage: Stage,
) -> None:
    stage.promote()
    stage.kube.stall("vllm-canary")  # the replaced flags' pods never become ready
    stage.traffic.kind = "agents"
    drift = await tick(stage.h)
    (summary,) = drift.detail["revalidated"]
    assert summary.startswith(f"{ADR}: judged nothing; not judged: {NOT_RUN}")
    assert "vllm-canary exceeded its progress deadline (ProgressDeadlineExceeded" in summary
    assert stage.canary.calls == []
    # the replaced flags were written, then the fix put back and rolled out
    written = [read_flags(p.body["spec"]["template"]["spec"]["containers"][0]["args"])
               for p in stage.new_patches("vllm-canary")[-2:]]  # fmt: skip
    assert written == [read_flags(REPLACED), read_flags(FIX)]
    assert stage.kube.args("vllm-canary") == FIX and stage.kube.rolled_out("vllm-canary")
    (session,) = stage.sessions()
    assert session.state == "restored"
    assert "hold" not in stage.thread().split("What moved:")[1]


def test_a_before_run_without_an_actuator_is_a_config_error() -> None:
    target = {"vllm_url": VLLM_URL, "canary": {"drift_before_run": True}}
    with pytest.raises(ValidationError) as caught:
        Settings.model_validate({"targets": {"prod-a": target}})
    message = str(caught.value)
    assert "drift_before_run" in message and "[targets.NAME.actuator]" in message
    assert "set drift_before_run = false" in message
    allowed = target | {"actuator": {"kind": "dry-run"}}  # the good case: it validates
    Settings.model_validate({"targets": {"prod-a": allowed}})


def test_a_before_run_never_goes_on_the_pods_serving_production() -> None:
    """A Kubernetes or git actuator without a canary stage would put the old flags on every
    pod that serves: the config refuses it, and takes the same actuator with a canary."""
    kube = kube_target("http://canary.test", drift_before_run=True)
    main_only = {key: value for key, value in kube["actuator"].items() if "canary" not in key}
    git = {"kind": "git", "repo_url": "https://git.test/infra.git", "direct_push": True,
           "locator": {"file": "vllm.yaml", "args": "spec.args"},
           "cluster": {"namespace": "inference", "deployment": "vllm"}}  # fmt: skip
    for actuator in (main_only, git):
        with pytest.raises(ValidationError) as caught:
            Settings.model_validate({"targets": {"prod-a": kube | {"actuator": actuator}}})
        message = str(caught.value)
        assert "never on the pods serving production" in message, message
        assert "canary_deployment and canary_url" in message and "= false" in message
    Settings.model_validate({"targets": {"prod-a": kube}})  # the good case: with its canary


async def test_a_dry_run_actuator_is_not_asked_for_a_before(
    tmp_path: Path, slack: FakeSlack
) -> None:
    traffic = Traffic()
    gate = StageCanary(FakeKube(), "http://unused.test")
    scheduler = {"workload_every_s": 300, "workload_window_s": 60,
                 "targets": {"prod-a": {"adrs": [ADR]}}}  # fmt: skip
    dry = {"vllm_url": VLLM_URL, "actuator": {"kind": "dry-run"},
           "canary": {"drift_before_run": True}}  # fmt: skip
    h = harness(tmp_path, slack=slack, scheduler=scheduler, transport=traffic.transport(),
                targets={"prod-a": dry}, bot_options={"gate": gate})  # fmt: skip
    try:
        record_workload(Path(h.bot.flows.settings.paths.adr), chat())
        set_gates(h, RELATIVE)
        replaced = Deployed(flags=read_flags(REPLACED), base_url=VLLM_URL)
        Stage(h, FakeKube(), gate, traffic, slack, replaced, "", 0).promote()
        traffic.kind = "agents"
        drift = await tick(h)
        why = "the dry-run actuator changes no flags"
        assert drift.detail["revalidated"] == [f"{ADR}: judged nothing; not judged: {NOT_RUN}{why}"]
        assert gate.calls == []
        with h.bot.db.transaction() as s:
            assert list(s.scalars(select(TuneSession))) == []
    finally:
        await h.close()


async def test_a_target_that_serves_the_replaced_flags_again_is_not_run_twice(
    stage: Stage,
) -> None:
    stage.promote()
    for name in ("vllm", "vllm-canary"):  # someone put the old flags back by hand
        spec = stage.kube.deployments[("inference", name)]["spec"]["template"]["spec"]
        spec["containers"][0]["args"] = list(REPLACED)
    stage.traffic.kind = "agents"
    drift = await tick(stage.h)
    why = f"prod-a already serves the flags {ADR} replaced"
    assert drift.detail["revalidated"] == [f"{ADR}: judged nothing; not judged: {NOT_RUN}{why}"]
    assert stage.new_patches() == [] and stage.canary.calls == [] and stage.sessions() == []


async def test_a_restore_that_fails_fails_the_period_loudly(stage: Stage) -> None:
    stage.promote()
    stage.canary.refuse_patches_after = True  # measured, then the flags cannot be put back
    stage.traffic.kind = "agents"
    drift = await tick(stage.h)
    assert drift.state == "failed"
    assert drift.detail["error"].startswith("the ROLLBACK FAILED: ")
    assert drift.detail["error"].endswith(
        "Manual action needed: restore --max-num-batched-tokens=2048"
    )
    (session,) = stage.sessions()
    assert session.state == "failed"  # not "restored": the rollback-failed alert counts it
    assert stage.actions() == ["tune.started", "tune.restoring", FAILED]
    assert stage.kube.args("vllm-canary") == REPLACED  # what a person must restore by hand
    posted = [m.args["text"] for m in stage.slack.of("chat.postMessage")]
    assert not any("hold" in text for text in posted)  # nothing holds on a half-restored target
