"""Why the git actuator exists, side by side: under Argo CD with selfHeal, the Kubernetes
actuator's live patch is reverted at the controller's next pass, the git actuator's commit is
what the controller deploys and keeps. Without selfHeal the patch stays, but the application
is OutOfSync until someone syncs it away; the commit leaves it Synced."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.change.actuators.base import ChangeContext
from bot.change.actuators.kubernetes import KubernetesActuator
from bot.change.argv import merge, read_flags
from bot.kernel.config import KubernetesActuatorSpec
from tests.fakes.clock import FakeTime
from tests.gitops_rig import CANARY_URL, VLLM_URL, Rig, make_rig

APP = "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/vllm"
CHANGE = {"max-num-batched-tokens": 2048}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    yield from make_rig(tmp_path)


@pytest.fixture
def no_heal_rig(tmp_path: Path) -> Iterator[Rig]:
    yield from make_rig(tmp_path, self_heal=False)


def kubernetes_actuator(rig: Rig) -> KubernetesActuator:
    """The Kubernetes actuator on the same cluster, polling on a clock of its own (the GitOps
    controller's next pass comes after its rollout, as Argo CD's interval would)."""
    spec = KubernetesActuatorSpec(
        kind="kubernetes", api_url=rig.api.url, namespace="inference", deployment="vllm",
        canary_deployment="vllm-canary", canary_url=CANARY_URL, token_file=rig.kube_token,
        ca_file=None, poll_interval_s=1.0,
    )  # fmt: skip
    clock = FakeTime()
    return KubernetesActuator(spec, vllm_url=VLLM_URL, sleep=clock.sleep, monotonic=clock.clock)


def canary_tokens(rig: Rig) -> int:
    value = read_flags(rig.args("vllm-canary"))["max-num-batched-tokens"]
    assert isinstance(value, int)
    return value


async def test_selfheal_reverts_the_live_patch_and_keeps_the_commit(rig: Rig) -> None:
    # the Kubernetes actuator: patched and rolled out...
    patcher = kubernetes_actuator(rig)
    try:
        before = await patcher.current()
        applied = await patcher.apply(merge(before.flags, CHANGE))
        assert applied.flags["max-num-batched-tokens"] == 2048 and canary_tokens(rig) == 2048
    finally:
        await patcher.aclose()
    # ...and reverted by selfHeal at Argo CD's next pass
    rig.controller.reconcile()
    assert canary_tokens(rig) == 8192
    assert rig.controller.applied[-1] == (rig.fleet.head(), "self-heal")
    # the git actuator: the same change as a commit, which every later pass keeps
    committer = rig.actuator()
    before = await committer.current()
    committer.prepare(ChangeContext(change_id="remediation-1", title="ADR-20260831-01 on prod-a",
                                    before=before))  # fmt: skip
    applied = await committer.apply(merge(before.flags, CHANGE))
    assert applied.flags["max-num-batched-tokens"] == 2048
    for _ in range(3):
        rig.controller.reconcile()
        assert canary_tokens(rig) == 2048
    assert rig.controller.applied[-1] == (rig.fleet.head(), "sync")  # deployed, not healed
    status = rig.kube.custom[APP]["status"]
    assert status["sync"] == {"status": "Synced", "revision": rig.fleet.head()}
    assert status["health"]["status"] == "Healthy"


async def test_without_selfheal_the_patch_stays_but_the_application_is_out_of_sync(
    no_heal_rig: Rig,
) -> None:
    rig = no_heal_rig
    patcher = kubernetes_actuator(rig)
    try:
        before = await patcher.current()
        await patcher.apply(merge(before.flags, CHANGE))
    finally:
        await patcher.aclose()
    rig.controller.reconcile()
    assert canary_tokens(rig) == 2048  # kept, for now: the next manual sync reverts it
    assert rig.kube.custom[APP]["status"]["sync"]["status"] == "OutOfSync"
    # the git actuator's change (from the file's 8192: the live 2048 is drift) is in sync
    committer = rig.actuator()
    current = await committer.current()
    committer.prepare(ChangeContext(change_id="remediation-2", title="ADR-20260831-01 on prod-a",
                                    before=current))  # fmt: skip
    await committer.apply({"max-num-batched-tokens": 1024})
    rig.controller.reconcile()
    assert canary_tokens(rig) == 1024
    assert rig.kube.custom[APP]["status"]["sync"]["status"] == "Synced"
