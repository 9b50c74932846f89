"""Whether Argo CD or Flux deploys a commit yet, read through the Kubernetes API.

An Argo CD Application (``argoproj.io/v1alpha1``) has deployed a commit when its
``status.sync.revision`` is that commit or a later one, ``status.sync.status`` is ``Synced`` and
``status.health.status`` is ``Healthy``. A Flux Kustomization
(``kustomize.toolkit.fluxcd.io/v1``) has when ``status.lastAppliedRevision`` (``main@sha1:<sha>``)
is, and its ``Ready`` condition is ``True``. A sync that failed at (or after) the commit, a
Degraded application, or a Kustomization whose reconciliation failed there is an
ActuatorError at once: waiting longer would not help.

"A later one" is decided by the repository (``Contains``): someone may push after ruleloop, and
the tool then deploys both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from bot.change.actuators import kube_read
from bot.change.actuators.base import ActuatorError
from bot.kernel import ArgoCdSyncSpec, FluxSyncSpec

ARGO = ("argoproj.io/v1alpha1", "applications", "Argo CD Application")
FLUX = ("kustomize.toolkit.fluxcd.io/v1", "kustomizations", "Flux Kustomization")
FLUX_FAILED = {"ReconciliationFailed", "BuildFailed", "HealthCheckFailed", "ArtifactFailed"}
# whether a revision the tool reports holds the commit (is it, or descends from it)
Contains = Callable[[str], Awaitable[bool]]


async def waiting(
    http: httpx.AsyncClient, spec: ArgoCdSyncSpec | FluxSyncSpec, commit: str, contains: Contains
) -> str | None:
    """What deploying ``commit`` still waits for, None when it is deployed."""
    api_version, plural, noun = ARGO if isinstance(spec, ArgoCdSyncSpec) else FLUX
    name = spec.application if isinstance(spec, ArgoCdSyncSpec) else spec.kustomization
    where = f"{noun} {spec.namespace}/{name}"

    def describe(code: int, message: str) -> str:
        if code == 403:
            return (
                f"the service account may not get {plural}.{api_version.split('/')[0]} in "
                f"namespace {spec.namespace} (403: {message}); grant get on it, see "
                "docs/remediation-gitops.md"
            )
        if code == 404:
            return (
                f"{where} does not exist (404: {message}); check [sync] in the target's "
                "actuator settings"
            )
        return f"the Kubernetes API answered {code} to GET {where}: {message}"

    obj = await kube_read.request_json(
        http, "GET", kube_read.custom_object_path(api_version, spec.namespace, plural, name),
        what=where, describe=describe,
    )  # fmt: skip
    if isinstance(spec, ArgoCdSyncSpec):
        return await _argo(obj, where, commit, contains)
    return await _flux(obj, where, commit, contains)


async def _argo(obj: Mapping[str, Any], where: str, commit: str, contains: Contains) -> str | None:
    status = obj.get("status") or {}
    sync = status.get("sync") or {}
    health = status.get("health") or {}
    operation = status.get("operationState") or {}
    tried = (operation.get("syncResult") or {}).get("revision") or (
        (operation.get("operation") or {}).get("sync") or {}
    ).get("revision")
    if operation.get("phase") in ("Failed", "Error") and tried and await contains(str(tried)):
        raise ActuatorError(
            f"{where} failed to sync {_short(str(tried))} "
            f"({operation.get('phase')}: {operation.get('message', 'no message')}): see the "
            "Application in Argo CD"
        )
    revision = str(sync.get("revision") or "")
    revisions = [str(r) for r in sync.get("revisions") or []]  # a multi-source Application
    if not any([await contains(r) for r in [revision, *revisions] if r]):
        shown = _short(revision) if revision else "none"
        return (
            f"{where} to sync commit {_short(commit)} (it compares against {shown}, "
            f"{sync.get('status', 'Unknown')})"
        )
    if sync.get("status") != "Synced":
        return f"{where} to be Synced at {_short(commit)} (it is {sync.get('status', 'Unknown')})"
    state = health.get("status", "Unknown")
    if state == "Degraded":
        raise ActuatorError(
            f"{where} is Degraded after syncing {_short(commit)} "
            f"({health.get('message', 'no message')}): see its resources in Argo CD"
        )
    if state != "Healthy":
        return f"{where} to be Healthy (it is {state})"
    return None


async def _flux(obj: Mapping[str, Any], where: str, commit: str, contains: Contains) -> str | None:
    status = obj.get("status") or {}
    conditions: list[dict[str, Any]] = status.get("conditions") or []
    ready: dict[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
    attempted = _flux_sha(status.get("lastAttemptedRevision"))
    if (
        ready.get("status") == "False"
        and ready.get("reason") in FLUX_FAILED
        and attempted
        and await contains(attempted)
    ):
        raise ActuatorError(
            f"{where} failed to apply {_short(attempted)} ({ready.get('reason')}: "
            f"{ready.get('message', 'no message')}): see `flux get kustomizations`"
        )
    applied = _flux_sha(status.get("lastAppliedRevision"))
    if not applied or not await contains(applied):
        shown = _short(applied) if applied else "none"
        return f"{where} to apply commit {_short(commit)} (it has applied {shown})"
    if ready.get("status") != "True":
        return (
            f"{where} to be Ready (it is {ready.get('status', 'Unknown')}: "
            f"{ready.get('reason', 'no reason')})"
        )
    return None


def _flux_sha(revision: object) -> str | None:
    """The commit of a Flux revision: ``main@sha1:<sha>`` (Flux 2) or ``main/<sha>`` (older)."""
    if not revision:
        return None
    text = str(revision)
    if "sha1:" in text:
        return text.rsplit("sha1:", 1)[1]
    return text.rsplit("/", 1)[-1]


def _short(sha: str) -> str:
    return sha[:12]
