"""Argo CD (or Flux) for tests: the repository's branch, rendered and applied to the fake cluster.

Each ``reconcile()`` does what the GitOps controller does on its polling interval:

1. read the branch's head in the bare repository; on a new revision, check it out (``git
   archive``) and render ``path`` with the real ``kubectl kustomize``;
2. compare each rendered Deployment's containers' ``args`` with the live ones in the fake
   Kubernetes API (``tests.fakes.kube_api``); a Deployment not there yet is created;
3. apply the rendered args (a strategic merge patch through the fake's API, as ``kubectl
   apply`` sends one) when the revision is new (auto-sync) or, with ``self_heal``, when the
   live args drifted from the rendered ones at the same revision (someone patched the live
   Deployment, e.g. the Kubernetes actuator); without self_heal a drift stays and the
   application is ``OutOfSync``;
4. write the status an actuator reads: for Argo CD an Application with ``sync.revision``,
   ``sync.status``, ``operationState`` and ``health`` (Healthy once every Deployment's rollout
   is complete, Progressing before, Degraded after ProgressDeadlineExceeded); for Flux a
   Kustomization with ``lastAppliedRevision: main@sha1:<sha>`` and a ``Ready`` condition (Flux
   always corrects drift on its interval: ``self_heal`` is forced on).

``start(interval_s)`` runs reconcile in a thread (for bots in other processes); in-process tests
call ``reconcile()`` where the actuator sleeps, so nothing waits on a clock. Changes to the fake
are made holding ``lock`` (the ``KubeServer``'s), as every API request is.
"""

from __future__ import annotations

import asyncio
import copy
import subprocess
import tarfile
import tempfile
import threading
from io import BytesIO
from pathlib import Path
from typing import Any

import httpx

from tests.fakes.kube_api import PATCH_TYPE, TOKEN, FakeKube
from tests.kustomize_render import kustomize

ARGO_PATH = "/apis/argoproj.io/v1alpha1/namespaces/{ns}/applications/{name}"
FLUX_PATH = "/apis/kustomize.toolkit.fluxcd.io/v1/namespaces/{ns}/kustomizations/{name}"


class GitOpsController:
    """Deploys ``path`` of ``branch`` of the bare repository ``bare`` into ``kube``."""

    def __init__(
        self,
        kube: FakeKube,
        *,
        bare: Path,
        path: str,
        lock: threading.RLock | None = None,
        branch: str = "main",
        kind: str = "argocd",
        name: str = "vllm",
        namespace: str | None = None,
        self_heal: bool = True,
        replicas: int | None = None,
    ) -> None:
        self.kube = kube
        self.bare = bare
        self.path = path
        self.lock = lock or threading.RLock()
        self.branch = branch
        self.kind = kind
        self.name = name
        self.namespace = namespace or ("argocd" if kind == "argocd" else "flux-system")
        self.self_heal = self_heal or kind == "flux"
        self.replicas = replicas  # override the rendered replicas (a small fake rollout)
        self.revision: str | None = None
        self.applied: list[tuple[str, str]] = []  # (revision, why: "sync" | "self-heal")
        self._rendered: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0

    # --- running ----------------------------------------------------------------------------

    def start(self, interval_s: float = 0.2) -> GitOpsController:
        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.reconcile()
                except Exception as exc:  # a controller keeps going, as the real one does
                    print(f"gitops controller: {type(exc).__name__}: {exc}")

        self.reconcile()
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    async def sleep(self, _seconds: float) -> None:
        """An actuator's ``sleep`` for in-process tests: one controller pass instead."""
        await asyncio.to_thread(self.reconcile)

    # --- one pass -----------------------------------------------------------------------------

    def reconcile(self) -> None:
        head = self._head()
        new = head != self.revision
        if new:
            self._rendered = [o for o in self._render(head) if o["kind"] == "Deployment"]
        with self.lock:
            for obj in self._rendered:  # time passes for the cluster's own controllers too
                meta = obj["metadata"]
                if self._live(obj) is not None:
                    self.kube.handle(httpx.Request(
                        "GET", f"https://kube.test/apis/apps/v1/namespaces/"
                        f"{meta.get('namespace', 'default')}/deployments/{meta['name']}",
                        headers={"Authorization": f"Bearer {TOKEN}"},
                    ))  # fmt: skip
            drifted = []
            for obj in self._rendered:
                if self._drifted(obj):
                    drifted.append(obj)
            why = "sync" if new else "self-heal"
            if drifted and (new or self.self_heal):
                for obj in drifted:
                    self._apply(obj)
                self.applied.append((head, why))
                drifted = []
            self.revision = head
            self._write_status(head, out_of_sync=bool(drifted))
        self.passes += 1

    def _head(self) -> str:
        out = subprocess.run(
            ["git", "rev-parse", f"refs/heads/{self.branch}"], cwd=self.bare, capture_output=True,
            text=True, check=True,
        )  # fmt: skip
        return out.stdout.strip()

    def _render(self, revision: str) -> list[dict[str, Any]]:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", revision], cwd=self.bare, capture_output=True,
            check=True,
        )  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
                tar.extractall(tmp, filter="data")
            return kustomize(Path(tmp) / self.path)

    def _live(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        meta = obj["metadata"]
        return self.kube.deployments.get((meta.get("namespace", "default"), meta["name"]))

    def _drifted(self, obj: dict[str, Any]) -> bool:
        live = self._live(obj)
        if live is None:
            return True
        have = {
            c["name"]: c.get("args", []) for c in live["spec"]["template"]["spec"]["containers"]
        }
        want = {c["name"]: c.get("args", []) for c in obj["spec"]["template"]["spec"]["containers"]}
        return any(have.get(name) != args for name, args in want.items())

    def _apply(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        namespace = meta.get("namespace", "default")
        containers = copy.deepcopy(obj["spec"]["template"]["spec"]["containers"])
        if self._live(obj) is None:
            replicas = self.replicas or int(obj["spec"].get("replicas", 1))
            self.kube.add_deployment(meta["name"], namespace=namespace, containers=containers,
                                     replicas=replicas)  # fmt: skip
            return
        patch = {"spec": {"template": {"spec": {"containers": [
            {"name": c["name"], "args": c.get("args", [])} for c in containers]}}}}  # fmt: skip
        response = self.kube.handle(httpx.Request(
            "PATCH", f"https://kube.test/apis/apps/v1/namespaces/{namespace}/deployments/"
            f"{meta['name']}", json=patch,
            headers={"Content-Type": PATCH_TYPE, "Authorization": f"Bearer {TOKEN}"},
        ))  # fmt: skip
        assert response.status_code == 200, response.text

    # --- status -------------------------------------------------------------------------------

    def _health(self) -> tuple[str, str]:
        for obj in self._rendered:
            live = self._live(obj)
            if live is None:
                return "Missing", f"Deployment {obj['metadata']['name']} is missing"
            status, spec = live.get("status", {}), live["spec"]
            if status.get("observedGeneration", 0) < live["metadata"]["generation"]:
                return (
                    "Progressing",
                    "Waiting for rollout to finish: observed deployment "
                    "generation less than desired generation",
                )  # as Argo CD's health check
            for cond in status.get("conditions", []):
                if cond.get("reason") == "ProgressDeadlineExceeded":
                    return "Degraded", f"Deployment {live['metadata']['name']}: {cond['message']}"
            want = int(spec.get("replicas", 1))
            done = (
                status.get("observedGeneration", 0) >= live["metadata"]["generation"]
                and status.get("updatedReplicas", 0) == want
                and status.get("replicas", 0) == want
                and status.get("availableReplicas", 0) == want
            )
            if not done:
                return "Progressing", "Waiting for rollout to finish"
        return "Healthy", ""

    def _write_status(self, head: str, *, out_of_sync: bool) -> None:
        health, message = self._health()
        if self.kind == "argocd":
            path = ARGO_PATH.format(ns=self.namespace, name=self.name)
            self.kube.custom[path] = {
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"source": {"path": self.path, "targetRevision": self.branch},
                         "syncPolicy": {"automated": {"selfHeal": self.self_heal,
                                                      "prune": True}}},
                "status": {
                    "sync": {"status": "OutOfSync" if out_of_sync else "Synced",
                             "revision": head},
                    "health": {"status": health, **({"message": message} if message else {})},
                    "operationState": {"phase": "Succeeded", "message": "successfully synced",
                                       "syncResult": {"revision": head}},
                },
            }  # fmt: skip
            return
        path = FLUX_PATH.format(ns=self.namespace, name=self.name)
        ready = health == "Healthy"
        revision = f"{self.branch}@sha1:{head}"
        self.kube.custom[path] = {
            "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {"path": f"./{self.path}", "prune": True,
                     "sourceRef": {"kind": "GitRepository", "name": "fleet"}},
            "status": {
                "lastAttemptedRevision": revision,
                "lastAppliedRevision": revision,
                "conditions": [{
                    "type": "Ready", "status": "True" if ready else "Unknown",
                    "reason": "ReconciliationSucceeded" if ready else "Progressing",
                    "message": f"Applied revision: {revision}" if ready else "Health check in progress",
                }],
            },
        }  # fmt: skip
