"""The Kubernetes actuator: rewrite the vLLM flags in a Deployment's container args, then wait.

    current()   GET the Deployment; flags are read from the container's ``args``
    apply()     PATCH the canary Deployment (the main one when there is no canary) and wait
    promote()   PATCH the main Deployment with the same change and wait (no-op without canary)
    rollback()  PATCH back exactly the recorded args (and pod-template annotation), wait, verify;
                the record keeps no values of arguments off the allowlist (``argv.record``):
                they are read back from the Deployment and checked against the record's hash
    stage()     PATCH the canary Deployment (the main one without canary) with the main one's
                recorded args, restored as rollback() restores them (tunable flags not recorded
                are removed), wait, verify; the main Deployment is left alone

Only ``args`` is rewritten: vLLM images run the server as their entrypoint and take flags in
``args``. A container whose ``command`` carries tunable flags is refused (rewriting ``args``
would not change them and reading ``args`` would misreport them).

Patches are strategic merge patches (``application/strategic-merge-patch+json``): containers
merge by name, so the patch names one container and sets its ``args`` and leaves the rest of
the pod template alone. Each also sets the pod-template annotation ``ruleloop.dev/applied-flags``
(the tunable flags, as JSON), so the rollout is traceable to ruleloop. apply and promote carry
``metadata.resourceVersion`` as a precondition: the new args were computed from what was read,
and someone else's edit in between answers 409, after which the Deployment is read again and
the patch retried once. A rollback writes fixed recorded values and needs no precondition.

Waiting reads the Deployment the way ``kubectl rollout status`` does (``rollout_waiting``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from bot.adr import canonical
from bot.change.actuators import kube_read
from bot.change.actuators.base import ActuatorError, Deployed
from bot.change.actuators.kube_read import (
    ANNOTATION,
    PATCH_TYPE,
    rollout_waiting,
)
from bot.change.argv import (
    FlagValues,
    fingerprint,
    flags_text,
    read_flags,
    record,
    recorded_flags,
    restore,
    with_flags,
)
from bot.kernel import AdrError, KubernetesActuatorSpec

__all__ = ["ANNOTATION", "PATCH_TYPE", "KubernetesActuator", "build_client", "rollout_waiting"]

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class _Read:
    """What one GET of a Deployment told: the container to change and its pod template."""

    deployment: str
    container: str
    args: list[str]
    generation: int
    resource_version: str
    annotation: str | None  # the current ruleloop.dev/applied-flags value, None when unset


_Conflict = kube_read.Conflict  # the API answered 409: the Deployment changed since it was read


def build_client(
    spec: KubernetesActuatorSpec, *, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """The API client production uses: base_url=api_url, the bearer token from token_file
    (none when unset, e.g. behind ``kubectl proxy``), the cluster CA from ca_file when it exists."""
    return kube_read.client(
        spec.api_url, token_file=spec.token_file, ca_file=spec.ca_file, transport=transport
    )


class KubernetesActuator:
    """Changes the vLLM flags of one Deployment (after a canary Deployment, when configured)."""

    kind = "kubernetes"
    changes_flags = True

    def __init__(
        self,
        spec: KubernetesActuatorSpec,
        *,
        vllm_url: str,
        http: httpx.AsyncClient | None = None,
        sleep: Sleep = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec
        self.vllm_url = vllm_url
        self._owns_http = http is None
        self._http = http if http is not None else build_client(spec)
        self._sleep = sleep
        self._monotonic = monotonic

    async def aclose(self) -> None:
        """Close the API client when this actuator built it."""
        if self._owns_http:
            await self._http.aclose()

    # --- the Actuator contract ----------------------------------------------------------------

    async def current(self) -> Deployed:
        """What serves now: the main Deployment's flags; canary load goes to the canary."""
        main = await self._read(self.spec.deployment)
        stage = self.spec.canary_deployment
        canary = await self._read(stage) if stage else None
        return self._deployed(main, canary, flags=read_flags(main.args))

    async def apply(self, flags: FlagValues) -> Deployed:
        """Set ``flags`` on the canary Deployment (the main one without canary); wait.
        The result reports the flags the stage now runs, read when its rollout completed."""
        if not self.spec.canary_deployment:
            main = await self._change(self.spec.deployment, flags)
            return self._deployed(main, None, flags=read_flags(main.args))
        canary = await self._change(self.spec.canary_deployment, flags)
        main = await self._read(self.spec.deployment)
        return self._deployed(main, canary, flags=read_flags(canary.args))

    async def promote(self, flags: FlagValues) -> Deployed:
        """Set ``flags`` on the main Deployment too; without a canary there is nothing to do."""
        if not self.spec.canary_deployment:
            return await self.current()
        main = await self._change(self.spec.deployment, flags)
        canary = await self._read(self.spec.canary_deployment)
        return self._deployed(main, canary, flags=read_flags(main.args))

    async def rollback(self, before: Deployed) -> Deployed:
        """Restore the recorded args (and annotation) of every Deployment; wait; verify.

        The record keeps no argument values but the tunable flags' (``argv.record``): the
        other arguments are the ones running now, checked against the recorded fingerprint.
        When they changed meanwhile, the tunable flags are still put back, then ActuatorError
        says so (with fingerprints and tunable flags only: other values may be secrets)."""
        self._refuse_other_record(before, "roll back")
        stages = [(self.spec.deployment, "")]
        if self.spec.canary_deployment and _kept(before.detail, "canary_") is not None:
            stages.insert(0, (self.spec.canary_deployment, "canary_"))
        for name, prefix, args, exact in await self._restore(before.detail, stages):
            now = (await self._read(name)).args
            where = f"Deployment {self._where(name)}"
            if not exact:
                raise ActuatorError(
                    f"rolled back the tunable flags of {where} ({flags_text(read_flags(now))}), "
                    "but its other arguments are not the ones recorded before the change "
                    f"(argv {_short(fingerprint(now))}, recorded "
                    f"{_short(_kept_sha(before.detail, prefix))}): "
                    "someone else changed them meanwhile; ruleloop keeps no copy of their values "
                    "(they may hold secrets), so check them by hand: `kubectl rollout history`"
                )
            _refuse_unlike(now, args, where, "rolled back")
        return await self.current()

    async def stage(self, recorded: Deployed) -> Deployed:
        """Give the canary Deployment (the main one without a canary) the args ``recorded``
        kept of the main one, restored as a rollback restores them (their tunable flags exactly:
        those not recorded are removed; the other arguments the stage's own); wait; verify.
        The main Deployment is not touched when there is a canary."""
        self._refuse_other_record(recorded, "serve the recorded flags")
        name = self.spec.canary_deployment or self.spec.deployment
        ((_, _, args, _),) = await self._restore(recorded.detail, [(name, "")])
        staged = await self._read(name)
        _refuse_unlike(staged.args, args, f"Deployment {self._where(name)}", "staged")
        if not self.spec.canary_deployment:
            return self._deployed(staged, None, flags=read_flags(staged.args))
        main = await self._read(self.spec.deployment)
        return self._deployed(main, staged, flags=read_flags(staged.args))

    def _refuse_other_record(self, record_: Deployed, what: str) -> None:
        recorded = record_.detail.get("deployment")
        if recorded != self.spec.deployment:
            raise ActuatorError(
                f"cannot {what}: the record is for Deployment {recorded!r}, "
                f"this target's actuator changes {self.spec.deployment!r}"
            )

    async def _restore(
        self, detail: Mapping[str, Any], stages: list[tuple[str, str]]
    ) -> list[tuple[str, str, list[str], bool]]:
        """Each Deployment ``name`` given the args (and annotation) ``detail`` recorded under
        ``prefix`` ('' the main one's, 'canary_'), all patched first (they roll out side by
        side), then waited for: (name, prefix, the args, whether exactly the recorded ones)."""
        wanted: list[tuple[str, str, list[str], bool]] = []
        rollouts: list[tuple[str, int]] = []
        for name, prefix in stages:
            read = await self._read(name)
            args, exact = _restored(detail, prefix, read.args)
            annotation = _annotation(detail, prefix, args)
            wanted.append((name, prefix, args, exact))
            generation = read.generation  # already as recorded: its rollout may still run
            if read.args != args or read.annotation != annotation:
                generation = await self._patch(read, args, annotation, precondition=False)
            rollouts.append((name, generation))
        for name, generation in rollouts:
            await self._wait(name, generation)
        return wanted

    # --- steps --------------------------------------------------------------------------------

    async def _change(self, name: str, flags: FlagValues) -> _Read:
        """Rewrite the changed tunable flags in ``name``'s args and wait for the rollout;
        the Deployment as the completed rollout left it."""
        for attempt in (1, 2):
            read = await self._read(name)
            now = read_flags(read.args)
            changes = {canonical(k): v for k, v in flags.items() if now.get(canonical(k)) != v}
            if not changes:
                return read
            try:
                args = with_flags(read.args, changes)
            except AdrError as exc:
                raise ActuatorError(
                    f"cannot set these flags on {self._where(name)}: {exc}"
                ) from exc
            annotation = json.dumps(read_flags(args), sort_keys=True)
            try:
                generation = await self._patch(read, args, annotation, precondition=True)
            except _Conflict as exc:
                if attempt == 2:
                    raise ActuatorError(
                        f"Deployment {self._where(name)} kept changing while ruleloop patched it "
                        f"(409 twice: {exc}); someone else is editing it, try again later"
                    ) from exc
                continue
            return await self._wait(name, generation)
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def _patch(
        self, read: _Read, args: list[str], annotation: str | None, *, precondition: bool
    ) -> int:
        """Set one container's args and the annotation; the generation to wait for."""
        metadata: dict[str, Any] = {}
        if precondition:
            metadata["resourceVersion"] = read.resource_version
        body: dict[str, Any] = {
            "spec": {
                "template": {
                    "metadata": {"annotations": {ANNOTATION: annotation}},
                    "spec": {"containers": [{"name": read.container, "args": args}]},
                }
            }
        }
        if metadata:
            body["metadata"] = metadata
        obj = await self._call("PATCH", read.deployment, body)
        return int(obj.get("metadata", {}).get("generation", 0))

    async def _wait(self, name: str, generation: int) -> _Read:
        """Poll until the rollout of ``generation`` completes (the Deployment then), fails, or
        rollout_timeout_s passes."""
        deadline = self._monotonic() + self.spec.rollout_timeout_s
        while True:
            obj = await self._call("GET", name)
            waiting = rollout_waiting(obj, generation)
            if waiting is None:
                return self._parse(name, obj)
            if self._monotonic() >= deadline:
                raise ActuatorError(
                    f"Deployment {self._where(name)} did not finish rolling out within "
                    f"{self.spec.rollout_timeout_s:g} s: still waiting for {waiting}"
                )
            await self._sleep(self.spec.poll_interval_s)

    async def _read(self, name: str) -> _Read:
        return self._parse(name, await self._call("GET", name))

    def _parse(self, name: str, obj: dict[str, Any]) -> _Read:
        """The container to change, found in a Deployment object."""
        found = kube_read.find_container(obj, where=self._where(name), wanted=self.spec.container)
        return _Read(
            deployment=name,
            container=found.name,
            args=found.args,
            generation=found.generation,
            resource_version=found.resource_version,
            annotation=found.annotation,
        )

    def _deployed(self, main: _Read, canary: _Read | None, *, flags: FlagValues) -> Deployed:
        # the args as argv.record keeps them: values of other arguments may be secrets
        detail: dict[str, Any] = {
            "deployment": main.deployment,
            "container": main.container,
            "argv": record(main.args),
            "generation": main.generation,
            "annotation": main.annotation,
        }
        if canary is not None:
            detail.update(
                canary_deployment=canary.deployment,
                canary_argv=record(canary.args),
                canary_generation=canary.generation,
                canary_annotation=canary.annotation,
            )
        base_url = self.spec.canary_url if canary is not None and self.spec.canary_url else None
        return Deployed(flags=flags, base_url=base_url or self.vllm_url, detail=detail)

    # --- HTTP -----------------------------------------------------------------------------------

    def _where(self, name: str) -> str:
        return f"{self.spec.namespace}/{name}"

    async def _call(self, method: str, name: str, body: Any = None) -> dict[str, Any]:
        """One request on the Deployment ``name``; API errors become ActuatorError (409:
        _Conflict) with the API's own message."""
        return await kube_read.request_json(
            self._http,
            method,
            kube_read.deployment_path(self.spec.namespace, name),
            what=f"Deployment {self._where(name)}",
            describe=lambda code, message: self._error_text(method, name, code, message),
            body=body,
        )

    def _error_text(self, method: str, name: str, code: int, message: str) -> str:
        verb = "patch" if method == "PATCH" else "get"
        where = self._where(name)
        if code == 401:
            source = self.spec.token_file or "no token_file set"
            return (
                f"the Kubernetes API at {self._http.base_url} refused ruleloop's credentials "
                f"(401 {message}): check the service-account token ({source})"
            )
        if code == 403:
            return (
                f"the service account lacks RBAC permission to {verb} deployments in namespace "
                f"{self.spec.namespace} (403 on Deployment {where}: {message}); grant get and "
                "patch on deployments.apps, see docs/remediation-kubernetes.md"
            )
        if code == 404:
            return (
                f"Deployment {name} does not exist in namespace {self.spec.namespace} "
                f"(404: {message}); check namespace and deployment/canary_deployment in the "
                "target's actuator settings"
            )
        return f"the Kubernetes API answered {code} to {method} Deployment {where}: {message}"


def _kept(detail: Mapping[str, Any], prefix: str) -> Mapping[str, Any] | None:
    """The recorded command line of a stage ('' main, 'canary_'), if the record has one."""
    kept = detail.get(f"{prefix}argv")
    return kept if isinstance(kept, Mapping) else None


def _kept_sha(detail: Mapping[str, Any], prefix: str) -> str:
    kept = _kept(detail, prefix)
    return str(kept["sha256"]) if kept is not None else "(none)"


def _restored(detail: Mapping[str, Any], prefix: str, running: list[str]) -> tuple[list[str], bool]:
    """The args to restore on a stage, and whether they are exactly the recorded ones."""
    kept = _kept(detail, prefix)
    if kept is None:  # a record written before argv records: the args themselves
        return [str(a) for a in detail[f"{prefix}args"]], True
    return restore(kept, running)


def _refuse_unlike(now: list[str], args: list[str], where: str, done: str) -> None:
    """ActuatorError unless ``where`` runs ``args`` (someone else changed it meanwhile)."""
    if now != args:
        raise ActuatorError(
            f"{done} {where}, but its container args are now argv "
            f"{_short(fingerprint(now))} ({flags_text(read_flags(now))}) instead of "
            f"the recorded {_short(fingerprint(args))} ({flags_text(read_flags(args))}):"
            " someone else changed it; check `kubectl rollout history`"
        )


def _annotation(detail: Mapping[str, Any], prefix: str, args: list[str]) -> str | None:
    """The recorded pod-template annotation (none recorded: the restored flags)."""
    key = f"{prefix}annotation"
    if key in detail:
        return None if detail[key] is None else str(detail[key])
    kept = _kept(detail, prefix)
    flags = recorded_flags(kept) if kept is not None else read_flags(args)
    return json.dumps(flags, sort_keys=True)


def _short(sha: str) -> str:
    """A fingerprint as people compare it: sha256:1a2b3c4d5e6f."""
    return sha[: len("sha256:") + 12]
