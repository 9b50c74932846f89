"""The parts a git-actuator test runs against, all real but the cluster and the forge's server.

A bare repository with the docs' example overlay (``tests.gitops_fleet``), the fake Kubernetes
API over HTTP (``KubeServer``), a GitOps controller that renders the repository with ``kubectl
kustomize`` and applies it (``tests.fakes.gitops_controller``), and GitHub/GitLab faked at the
wire (``tests.fakes.forge_api``). The actuator's ``sleep`` is one controller pass plus the fake
clock's advance, so waits cost no wall time and a timeout is reached by polls, not by seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.change.actuators.git import GitActuator
from bot.kernel.config import (
    ArgoCdSyncSpec,
    FluxSyncSpec,
    ForgeSpec,
    GitActuatorSpec,
    GitClusterSpec,
    GitLocatorSpec,
)
from tests.fakes.clock import FakeTime
from tests.fakes.forge_api import FORGE_TOKEN, FakeForge
from tests.fakes.gitops_controller import GitOpsController
from tests.fakes.kube_api import TOKEN, FakeKube
from tests.fakes.kube_server import KubeServer
from tests.gitops_fleet import ARGS_PATH, CANARY_FILE, MAIN_FILE, OVERLAY, Fleet

VLLM_URL = "http://vllm.inference.svc:8000"
CANARY_URL = "http://vllm-canary.inference.svc:8000"
TARGET = "prod-a"


@dataclass
class Rig:
    tmp_path: Path
    fleet: Fleet
    kube: FakeKube
    api: KubeServer
    controller: GitOpsController
    forge: FakeForge
    time: FakeTime = field(default_factory=FakeTime)
    forge_token: Path | None = None
    kube_token: Path | None = None

    def spec(self, *, forge: str | None = "github", canary: bool = True, sync: str | None = "argocd",
             **settings: Any) -> GitActuatorSpec:  # fmt: skip
        assert self.forge_token is not None and self.kube_token is not None
        forge_spec = None
        if forge is not None:
            api = self.forge.github_api if forge == "github" else self.forge.gitlab_api
            forge_spec = ForgeSpec.model_validate({
                "kind": forge, "project": "acme/fleet", "api_url": api,
                "token_file": self.forge_token, **settings.pop("forge_settings", {})})  # fmt: skip
        sync_spec: ArgoCdSyncSpec | FluxSyncSpec | None = None
        if sync == "argocd":
            sync_spec = ArgoCdSyncSpec(kind="argocd", application="vllm", namespace="argocd")
        elif sync == "flux":
            sync_spec = FluxSyncSpec(kind="flux", kustomization="vllm", namespace="flux-system")
        values: dict[str, Any] = {
            "kind": "git", "repo_url": str(self.fleet.bare), "forge": forge_spec,
            "direct_push": forge is None,
            "locator": GitLocatorSpec(file=MAIN_FILE, args=ARGS_PATH),
            "cluster": GitClusterSpec(
                api_url=self.api.url, namespace="inference", deployment="vllm",
                canary_deployment="vllm-canary" if canary else None, token_file=self.kube_token,
                ca_file=None),
            "sync": sync_spec, "workdir": self.tmp_path / "work", "poll_interval_s": 1.0,
            "rollout_timeout_s": 120.0,
        }  # fmt: skip
        if canary:
            values["canary_locator"] = GitLocatorSpec(file=CANARY_FILE, args=ARGS_PATH)
            values["canary_url"] = CANARY_URL
        values.update(settings)
        return GitActuatorSpec(**values)

    def actuator(
        self, spec: GitActuatorSpec | None = None, *, sleep: Any = None, **settings: Any
    ) -> GitActuator:
        return GitActuator(spec or self.spec(**settings), target=TARGET, vllm_url=VLLM_URL,
                           sleep=sleep or self.sleep, monotonic=self.time.clock)  # fmt: skip

    async def sleep(self, seconds: float) -> None:
        self.time.now += seconds
        await self.controller.sleep(seconds)

    def args(self, name: str) -> list[str]:
        with self.api.lock:
            return self.kube.args(name)


def make_rig(tmp_path: Path, *, kind: str = "argocd", self_heal: bool = True) -> Iterator[Rig]:
    """The rig, for a fixture to yield from (its servers stop after the test)."""
    fleet = Fleet.create(tmp_path)
    kube = FakeKube()
    forge_token = tmp_path / "forge-token"
    forge_token.write_text(FORGE_TOKEN + "\n")
    kube_token = tmp_path / "kube-token"
    kube_token.write_text(TOKEN)
    with KubeServer(kube) as api, FakeForge(fleet.bare) as forge:
        controller = GitOpsController(kube, bare=fleet.bare, path=OVERLAY, lock=api.lock,
                                      kind=kind, name="vllm", self_heal=self_heal, replicas=2)  # fmt: skip
        controller.reconcile()  # the Deployments as the repository has them, rolled out
        yield Rig(tmp_path, fleet, kube, api, controller, forge, forge_token=forge_token,
                  kube_token=kube_token)  # fmt: skip
