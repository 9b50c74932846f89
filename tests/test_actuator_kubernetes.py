"""The Kubernetes actuator against an HTTP-level fake of the apps/v1 Deployment API."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.change.actuators.base import ActuatorError, Deployed
from bot.change.actuators.kubernetes import (
    ANNOTATION,
    PATCH_TYPE,
    KubernetesActuator,
    build_client,
    rollout_waiting,
)
from bot.change.argv import merge, read_flags, record
from bot.kernel.config import KubernetesActuatorSpec
from tests.fakes.clock import FakeTime
from tests.fakes.kube_api import TOKEN, FakeKube

API = "https://kube.test"
VLLM_URL = "http://vllm.inference.svc:8000"
CANARY_URL = "http://vllm-canary.inference.svc:8000"
ARGS = [
    "--model",
    "/models/llama-3-8b",
    "--port",
    "8000",
    "--max-num-seqs",
    "256",
    "--enable-chunked-prefill",
    "--max-num-batched-tokens",
    "2048",
    "--disable-log-requests",
]
# ARGS with max-num-batched-tokens 8192: the old flag gone, the new one at the end, all else kept
CHANGED = [
    "--model",
    "/models/llama-3-8b",
    "--port",
    "8000",
    "--max-num-seqs",
    "256",
    "--enable-chunked-prefill",
    "--disable-log-requests",
    "--max-num-batched-tokens",
    "8192",
]
CHANGE = {"max-num-batched-tokens": 8192}

Make = Callable[..., KubernetesActuator]


@pytest.fixture
def kube() -> FakeKube:
    fake = FakeKube()
    # 4 replicas: maxUnavailable 25% is one pod, so the rollout passes through "all updated,
    # old pods gone, one not yet available" as well as "old pods pending termination"
    fake.add_deployment("vllm", args=ARGS, replicas=4)
    return fake


@pytest.fixture
def clock() -> FakeTime:
    return FakeTime()


@pytest.fixture
async def make(kube: FakeKube, clock: FakeTime) -> AsyncIterator[Make]:
    """Build an actuator on the fake API with the fake clock; settings override the spec."""
    clients: list[httpx.AsyncClient] = []

    def build(**settings: Any) -> KubernetesActuator:
        settings = {"namespace": "inference", "deployment": "vllm", **settings}
        spec = KubernetesActuatorSpec(kind="kubernetes", **settings)
        http = httpx.AsyncClient(
            transport=kube.transport, base_url=API, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        clients.append(http)
        return KubernetesActuator(
            spec, vllm_url=VLLM_URL, http=http, sleep=clock.sleep, monotonic=clock.clock
        )

    yield build
    for http in clients:
        await http.aclose()


def _template(kube: FakeKube, name: str) -> dict[str, Any]:
    return kube.deployments[("inference", name)]["spec"]["template"]


async def test_current_reads_flags_from_args(make: Make, kube: FakeKube) -> None:
    now = await make().current()
    assert now.flags == {
        "max-num-seqs": 256,
        "enable-chunked-prefill": True,
        "max-num-batched-tokens": 2048,
    }
    assert now.base_url == VLLM_URL
    assert now.detail["argv"] == record(ARGS)
    assert now.detail["deployment"] == "vllm"
    assert now.detail["container"] == "vllm"
    assert now.detail["generation"] == 1
    assert "canary_argv" not in now.detail
    assert now.detail["argv"]["shape"][:4] == [None] * 4  # --model and its value: not kept
    assert kube.patches() == []
    assert Deployed.from_json(json.loads(json.dumps(now.to_json()))) == now


async def test_apply_sends_one_strategic_merge_patch_and_waits(
    make: Make, kube: FakeKube, clock: FakeTime
) -> None:
    actuator = make(poll_interval_s=2.0)
    before = await actuator.current()
    after = await actuator.apply(merge(before.flags, CHANGE))

    [patch] = kube.patches()
    assert patch.content_type == PATCH_TYPE
    template = patch.body["spec"]["template"]
    assert template["spec"]["containers"] == [{"name": "vllm", "args": CHANGED}]
    assert json.loads(template["metadata"]["annotations"][ANNOTATION]) == read_flags(CHANGED)
    assert kube.args("vllm") == CHANGED
    container = _template(kube, "vllm")["spec"]["containers"][0]
    assert container["image"] == "vllm/vllm-openai:v0.11.0"  # merged by name, not replaced
    # it polled through the intermediate states, with the fake sleep, until fully rolled out
    assert len(kube.gets("vllm")) > 3
    assert len(clock.slept) > 3
    assert set(clock.slept) == {2.0}
    assert kube.rolled_out("vllm")
    assert after.flags["max-num-batched-tokens"] == 8192
    assert after.detail["argv"] == record(CHANGED)
    assert after.detail["generation"] == 2


async def test_apply_without_a_change_sends_no_patch(make: Make, kube: FakeKube) -> None:
    actuator = make()
    before = await actuator.current()
    after = await actuator.apply(dict(before.flags))
    assert kube.patches() == []
    assert after.detail["argv"] == record(ARGS)


async def test_rollback_restores_the_exact_recorded_args(make: Make, kube: FakeKube) -> None:
    actuator = make()
    before = await actuator.current()
    await actuator.apply(merge(before.flags, CHANGE))
    restored = await actuator.rollback(before)

    assert kube.args("vllm") == ARGS
    assert ANNOTATION not in _template(kube, "vllm")["metadata"].get("annotations", {})
    assert kube.rolled_out("vllm")
    assert [p.body["spec"]["template"]["spec"]["containers"] for p in kube.patches()] == [
        [{"name": "vllm", "args": CHANGED}],
        [{"name": "vllm", "args": ARGS}],
    ]
    assert restored.flags == before.flags
    assert restored.detail["argv"] == record(ARGS)


async def test_rollback_after_a_stalled_rollout(make: Make, kube: FakeKube) -> None:
    actuator = make()
    before = await actuator.current()
    kube.stall("vllm", deadline_after=2)
    with pytest.raises(ActuatorError):
        await actuator.apply(merge(before.flags, CHANGE))
    restored = await actuator.rollback(before)
    assert kube.args("vllm") == ARGS
    assert kube.rolled_out("vllm")
    assert restored.flags == before.flags


async def test_rollback_reports_args_that_did_not_stick(make: Make, kube: FakeKube) -> None:
    actuator = make()
    before = await actuator.current()
    await actuator.apply(merge(before.flags, CHANGE))

    def webhook_adds_a_seed(obj: dict[str, Any]) -> None:
        obj["spec"]["template"]["spec"]["containers"][0]["args"].append("--seed=0")

    kube.admission.append(webhook_adds_a_seed)
    with pytest.raises(ActuatorError, match="instead of the recorded") as failed:
        await actuator.rollback(before)
    assert "/models/llama-3-8b" not in str(failed.value)  # fingerprints, not argument values


async def test_rollback_puts_back_the_flags_but_keeps_other_args_someone_changed(
    make: Make, kube: FakeKube
) -> None:
    """The record keeps no values of other arguments: edited meanwhile, they stay as edited,
    the tunable flags are restored, and the rollback says what to check."""
    actuator = make()
    before = await actuator.current()
    await actuator.apply(merge(before.flags, CHANGE))
    args = kube.deployments[("inference", "vllm")]["spec"]["template"]["spec"]["containers"][0]
    args["args"] = [a.replace("llama-3-8b", "llama-3-8b-v2") for a in args["args"]]
    with pytest.raises(ActuatorError, match="other arguments are not the ones recorded") as failed:
        await actuator.rollback(before)
    assert "llama" not in str(failed.value) and "--max-num-batched-tokens=2048" in str(failed.value)
    now = kube.args("vllm")
    assert read_flags(now) == before.flags and "/models/llama-3-8b-v2" in now


async def test_rollback_waits_for_a_rollout_of_the_recorded_args_already_under_way(
    make: Make, kube: FakeKube
) -> None:
    """A replica killed mid-rollback left the recorded args patched but not rolled out: the
    one that takes over has nothing to patch, and still waits for the rollout to finish."""
    actuator = make()
    before = await actuator.current()
    await actuator.apply(merge(before.flags, CHANGE))
    patch = {"spec": {"template": {"metadata": {"annotations": {ANNOTATION: None}},
                                   "spec": {"containers": [{"name": "vllm", "args": ARGS}]}}}}  # fmt: skip
    kube.handle(
        httpx.Request(
            "PATCH",
            f"{API}/apis/apps/v1/namespaces/inference/deployments/vllm",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": PATCH_TYPE},
            content=json.dumps(patch).encode(),
        )  # fmt: skip
    )
    assert kube.args("vllm") == ARGS and not kube.rolled_out("vllm")
    patches = len(kube.patches())
    restored = await actuator.rollback(before)
    assert len(kube.patches()) == patches  # nothing to patch
    assert kube.rolled_out("vllm") and restored.flags == before.flags


async def test_rollback_refuses_a_record_of_another_deployment(make: Make) -> None:
    record = Deployed(flags={}, base_url=VLLM_URL, detail={"deployment": "other", "args": []})
    with pytest.raises(ActuatorError, match="record is for Deployment 'other'"):
        await make().rollback(record)


async def test_canary_apply_patches_only_the_canary_and_promote_the_main(
    make: Make, kube: FakeKube
) -> None:
    kube.add_deployment("vllm-canary", args=ARGS, replicas=1)
    actuator = make(canary_deployment="vllm-canary", canary_url=CANARY_URL)
    before = await actuator.current()
    assert before.base_url == CANARY_URL
    assert before.detail["canary_argv"] == record(ARGS)

    flags = merge(before.flags, CHANGE)
    applied = await actuator.apply(flags)
    assert [p.path.rsplit("/", 1)[1] for p in kube.patches()] == ["vllm-canary"]
    assert kube.args("vllm-canary") == CHANGED
    assert kube.args("vllm") == ARGS
    assert kube.rolled_out("vllm-canary")
    assert applied.flags["max-num-batched-tokens"] == 8192
    assert applied.base_url == CANARY_URL

    promoted = await actuator.promote(flags)
    assert [p.path.rsplit("/", 1)[1] for p in kube.patches()] == ["vllm-canary", "vllm"]
    assert kube.args("vllm") == CHANGED
    assert kube.rolled_out("vllm")
    assert promoted.flags["max-num-batched-tokens"] == 8192

    await actuator.rollback(before)
    assert kube.args("vllm") == ARGS
    assert kube.args("vllm-canary") == ARGS
    assert kube.rolled_out("vllm") and kube.rolled_out("vllm-canary")


async def test_stage_serves_a_record_exactly_on_the_canary_and_a_rollback_undoes_it(
    make: Make, kube: FakeKube
) -> None:
    """A drift before-run's stage: the change it undoes set one flag and added two; the canary
    serves exactly the recorded args (the added flags gone), the main Deployment is left alone,
    and a fresh actuator (a replica resuming a killed before-run) restores what served."""
    kube.add_deployment("vllm-canary", args=ARGS, replicas=1)
    actuator = make(canary_deployment="vllm-canary", canary_url=CANARY_URL)
    replaced = await actuator.current()
    change = {**CHANGE, "block-size": 32, "enable-prefix-caching": True}
    await actuator.apply(merge(replaced.flags, change))
    await actuator.promote(merge(replaced.flags, change))
    fixed = kube.args("vllm")
    assert read_flags(fixed) == read_flags(ARGS) | change and kube.args("vllm-canary") == fixed
    serving = await actuator.current()
    patched = len(kube.patches())

    staged = await actuator.stage(replaced)
    assert kube.args("vllm-canary") == ARGS  # no --block-size, no --enable-prefix-caching
    assert staged.flags == replaced.flags and staged.base_url == CANARY_URL
    assert kube.args("vllm") == fixed and kube.rolled_out("vllm-canary")
    assert [p.path.rsplit("/", 1)[1] for p in kube.patches()[patched:]] == ["vllm-canary"]

    await make(canary_deployment="vllm-canary", canary_url=CANARY_URL).rollback(serving)
    assert kube.args("vllm-canary") == kube.args("vllm") == fixed
    assert [p.path.rsplit("/", 1)[1] for p in kube.patches()[patched:]] == ["vllm-canary"] * 2


async def test_stage_without_canary_is_the_main_deployment(make: Make, kube: FakeKube) -> None:
    actuator = make()
    replaced = await actuator.current()
    await actuator.apply(merge(replaced.flags, {**CHANGE, "block-size": 32}))
    await actuator.stage(replaced)
    assert kube.args("vllm") == ARGS


async def test_stage_refuses_a_record_of_another_deployment(make: Make) -> None:
    with pytest.raises(ActuatorError, match="cannot serve the recorded flags"):
        await make().stage(Deployed(flags={}, base_url=VLLM_URL, detail={"deployment": "x"}))


async def test_canary_rollback_leaves_an_unchanged_main_alone(make: Make, kube: FakeKube) -> None:
    kube.add_deployment("vllm-canary", args=ARGS, replicas=1)
    actuator = make(canary_deployment="vllm-canary", canary_url=CANARY_URL)
    before = await actuator.current()
    await actuator.apply(merge(before.flags, CHANGE))
    await actuator.rollback(before)
    assert [p.path.rsplit("/", 1)[1] for p in kube.patches()] == ["vllm-canary", "vllm-canary"]
    assert kube.args("vllm-canary") == ARGS


async def test_promote_without_canary_changes_nothing(make: Make, kube: FakeKube) -> None:
    actuator = make()
    now = await actuator.promote(merge((await actuator.current()).flags, CHANGE))
    assert kube.patches() == []
    assert now.detail["argv"] == record(ARGS)


async def test_progress_deadline_exceeded_fails_clearly(make: Make, kube: FakeKube) -> None:
    kube.stall("vllm", deadline_after=2)
    actuator = make()
    with pytest.raises(ActuatorError) as caught:
        await actuator.apply(merge((await actuator.current()).flags, CHANGE))
    message = str(caught.value)
    assert "Deployment inference/vllm" in message
    assert "ProgressDeadlineExceeded" in message
    assert "wanted 4, updated 1" in message
    assert "Traceback" not in message


async def test_rollout_timeout_fails_with_counts(
    make: Make, kube: FakeKube, clock: FakeTime
) -> None:
    kube.stall("vllm", deadline_after=None)
    actuator = make(rollout_timeout_s=30, poll_interval_s=2)
    flags = merge((await actuator.current()).flags, CHANGE)
    started = clock.now
    with pytest.raises(ActuatorError) as caught:
        await actuator.apply(flags)
    assert 30 <= clock.now - started <= 32
    message = str(caught.value)
    assert "Deployment inference/vllm did not finish rolling out within 30 s" in message
    assert "1 of 4 new replicas to be updated" in message


@pytest.mark.parametrize(
    ("status", "spec_replicas", "waiting"),
    [
        ({"observedGeneration": 1}, 3, "the controller to see generation 2"),
        ({"observedGeneration": 2, "replicas": 3}, 3, "0 of 3 new replicas to be updated"),
        (
            {"observedGeneration": 2, "replicas": 4, "updatedReplicas": 3, "availableReplicas": 3},
            3,
            "1 old replicas to terminate",
        ),
        (
            {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 2},
            3,
            "2 of 3 updated replicas to become available",
        ),
        (
            {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 3},
            3,
            None,
        ),
        ({"observedGeneration": 2}, 0, None),  # scaled to zero: zero counts are omitted
    ],
)
def test_rollout_waiting_reads_status_like_kubectl(
    status: dict[str, int], spec_replicas: int, waiting: str | None
) -> None:
    deployment = {
        "metadata": {"name": "vllm", "namespace": "inference", "generation": 2},
        "spec": {"replicas": spec_replicas},
        "status": status,
    }
    found = rollout_waiting(deployment, 2)
    assert found == waiting if waiting is None else found is not None and waiting in found


def test_rollout_waiting_ignores_a_stale_deadline_condition() -> None:
    stale = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}
    deployment = {
        "metadata": {"name": "vllm", "namespace": "inference", "generation": 3},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 2, "conditions": [stale]},
    }
    assert rollout_waiting(deployment, 3) == "the controller to see generation 3 (it has seen 2)"
    deployment["status"]["observedGeneration"] = 3
    with pytest.raises(ActuatorError, match="exceeded its progress deadline"):
        rollout_waiting(deployment, 3)


@pytest.mark.parametrize("verb", ["get", "patch"])
async def test_forbidden_says_rbac_is_missing(make: Make, kube: FakeKube, verb: str) -> None:
    kube.forbidden = {verb}
    with pytest.raises(ActuatorError) as caught:
        await make().apply(CHANGE)
    message = str(caught.value)
    assert f"service account lacks RBAC permission to {verb} deployments" in message
    assert f'cannot {verb} resource "deployments"' in message  # the API's own message


async def test_missing_deployment_says_so(make: Make) -> None:
    with pytest.raises(ActuatorError) as caught:
        await make(deployment="vllm-typo").current()
    message = str(caught.value)
    assert "Deployment vllm-typo does not exist in namespace inference" in message
    assert 'deployments.apps "vllm-typo" not found' in message


async def test_unknown_container_lists_the_containers(make: Make, kube: FakeKube) -> None:
    kube.add_deployment(
        "two",
        containers=[
            {"name": "vllm", "image": "vllm/vllm-openai", "args": ARGS},
            {"name": "metrics-sidecar", "image": "busybox"},
        ],
    )
    with pytest.raises(
        ActuatorError, match="no container 'engine'; its containers: vllm, metrics-sidecar"
    ):
        await make(deployment="two", container="engine").current()


async def test_first_container_is_the_default(make: Make, kube: FakeKube) -> None:
    kube.add_deployment(
        "two",
        containers=[
            {"name": "engine", "image": "vllm/vllm-openai", "args": ARGS},
            {"name": "metrics-sidecar", "image": "busybox", "args": ["--max-num-seqs", "1"]},
        ],
    )
    now = await make(deployment="two").current()
    assert now.detail["container"] == "engine"
    assert now.detail["argv"] == record(ARGS)


async def test_named_container_is_the_one_patched(make: Make, kube: FakeKube) -> None:
    kube.add_deployment(
        "two",
        containers=[
            {"name": "proxy", "image": "envoy", "args": ["--config", "/etc/envoy.yaml"]},
            {"name": "engine", "image": "vllm/vllm-openai", "args": ARGS},
        ],
    )
    actuator = make(deployment="two", container="engine")
    await actuator.apply(merge((await actuator.current()).flags, CHANGE))
    assert kube.args("two", container=0) == ["--config", "/etc/envoy.yaml"]
    assert kube.args("two", container=1) == CHANGED


async def test_flags_in_command_are_refused(make: Make, kube: FakeKube) -> None:
    command = ["vllm", "serve", "/models/x", "--max-num-seqs", "64"]
    kube.add_deployment("cmd", containers=[{"name": "vllm", "image": "v", "command": command}])
    with pytest.raises(ActuatorError, match="move the flags there"):
        await make(deployment="cmd").current()


async def test_conflict_rereads_and_retries_once(make: Make, kube: FakeKube) -> None:
    def someone_adds_a_seed(obj: dict[str, Any]) -> None:
        obj["spec"]["template"]["spec"]["containers"][0]["args"] += ["--seed", "7"]

    kube.before_patch.append(someone_adds_a_seed)
    await make().apply(CHANGE)
    assert [p.status for p in kube.patches()] == [409, 200]
    assert kube.args("vllm") == [*CHANGED[:-2], "--seed", "7", *CHANGED[-2:]]
    assert kube.rolled_out("vllm")


async def test_conflict_twice_fails(make: Make, kube: FakeKube) -> None:
    kube.before_patch += [lambda obj: None, lambda obj: None]
    with pytest.raises(ActuatorError, match="kept changing"):
        await make().apply(CHANGE)
    assert [p.status for p in kube.patches()] == [409, 409]


async def test_wrong_token_is_refused(kube: FakeKube, tmp_path: Path, clock: FakeTime) -> None:
    token = tmp_path / "token"
    token.write_text("not-the-token\n")
    spec = KubernetesActuatorSpec(
        kind="kubernetes",
        api_url=API,
        namespace="inference",
        deployment="vllm",
        token_file=token,
        ca_file=tmp_path / "missing-ca.crt",
    )
    async with build_client(spec, transport=kube.transport) as http:
        actuator = KubernetesActuator(spec, vllm_url=VLLM_URL, http=http, sleep=clock.sleep)
        with pytest.raises(ActuatorError) as caught:
            await actuator.current()
        assert "refused ruleloop's credentials (401 Unauthorized)" in str(caught.value)
        assert str(token) in str(caught.value)
        token.write_text(TOKEN + "\n")  # the kubelet rotated the token in place
        assert (await actuator.current()).detail["argv"] == record(ARGS)


async def test_unreachable_api_says_where(make: Make, clock: FakeTime) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    spec = KubernetesActuatorSpec(kind="kubernetes", namespace="inference", deployment="vllm")
    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse), base_url=API) as http:
        actuator = KubernetesActuator(spec, vllm_url=VLLM_URL, http=http, sleep=clock.sleep)
        with pytest.raises(
            ActuatorError, match="cannot reach the Kubernetes API at https://kube.test"
        ):
            await actuator.current()


# --- the fake itself: the behaviours the actuator's tests rely on ----------------------------


async def test_fake_kube_refuses_other_patch_types(kube: FakeKube) -> None:
    async with httpx.AsyncClient(transport=kube.transport, base_url=API) as http:
        response = await http.patch(
            "/apis/apps/v1/namespaces/inference/deployments/vllm",
            content=b"{}",
            headers={
                "Authorization": f"Bearer {TOKEN}",
                "Content-Type": "application/merge-patch+json",
            },
        )
    assert response.status_code == 415
    assert response.json()["kind"] == "Status"
    assert response.json()["reason"] == "UnsupportedMediaType"


async def test_fake_kube_bumps_generation_only_for_spec_changes(kube: FakeKube) -> None:
    path = "/apis/apps/v1/namespaces/inference/deployments/vllm"
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": PATCH_TYPE}
    async with httpx.AsyncClient(transport=kube.transport, base_url=API, headers=headers) as http:
        labelled = await http.patch(path, json={"metadata": {"labels": {"team": "a"}}})
        resized = await http.patch(path, json={"spec": {"replicas": 5}})
    assert labelled.json()["metadata"]["generation"] == 1
    assert resized.json()["metadata"]["generation"] == 2
