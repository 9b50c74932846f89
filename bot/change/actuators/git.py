"""The git actuator: the fix is a commit in the team's deployment repository, not a live patch.

With Argo CD or Flux, the repository is where the fleet's truth lives: a patch on the live
Deployment is reverted by selfHeal within minutes (or leaves the application OutOfSync), so a
change that is to last must be a commit the GitOps tool deploys.

    current()   fetch; read the flags in the locator's file at the branch's head and the live
                Deployment's args (the record: head sha, file blob, flags; never other args)
    apply()     one commit that sets the changed flags in the file (the canary's file when
                there is a canary), landed as a pull request ruleloop merges (or a direct
                push); then wait until the cluster serves it: the GitOps tool synced a
                revision that contains the commit and is healthy, the Deployment's args carry
                the flags and its rollout is complete
    promote()   the same commit on the main locator's file (nothing to do without a canary)
    rollback()  close what is open (pull requests, branches of this target), then one revert
                commit of every commit of this target since the recorded head that is not
                reverted yet, landed the same way; wait until the old flags serve again
    stage()     apply() of the flags the main Deployment ran when a record was made, on the
                canary's file; refused when the stage runs a flag the record has not (a file's
                edit removes no flag)

rollback is idempotent from any point, so a replica that takes over after a `kill -9` simply
calls it: the history since the recorded head says what landed (commit trailers, see
``bot.change.gitops.trailers``; the forge's rebase gives landed commits new shas), what is already
reverted (``Ruleloop-Revert-Of``), and open branches under ``ruleloop/<target>/`` say what is
half done. One change at a time per target (the remediation service's rule) makes "every
commit of this target since the head recorded at request time" exactly this change's commits.

A conflict is refused before anything is pushed (someone changed the file since current(): a
commit on it since the recorded head that is not this change's), or cleaned up when it shows
later (the push is not a fast-forward, the forge will not merge): the pull request is closed
and the branch deleted. Nothing is ever force-pushed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from bot.adr import canonical
from bot.change.actuators import kube_read, sync_status
from bot.change.actuators.base import ActuatorError, ChangeContext, Deployed
from bot.change.actuators.yaml_flags import Locator
from bot.change.argv import FlagValues, flags_text, read_flags, record
from bot.change.gitops import trailers
from bot.change.gitops.errors import GitConflict, GitOpsError
from bot.change.gitops.forge import Forge, build_forge
from bot.change.gitops.git import Commit, GitRepo
from bot.change.gitops.landing import Landing, Proposal
from bot.change.gitops.secrets import scrub
from bot.kernel import GitActuatorSpec, GitLocatorSpec

Sleep = Callable[[float], Awaitable[None]]
# what the cluster must run for a change to be served: flag -> value (None: not set)
Wanted = dict[str, bool | int | float | str | None]


@dataclass(frozen=True)
class Stage:
    """One file ruleloop changes and the Deployment that serves it ("canary" or "main")."""

    name: str
    locator: GitLocatorSpec
    deployment: str


class GitActuator:
    """Changes a target's vLLM flags by committing them to its deployment repository."""

    kind = "git"
    changes_flags = True

    def __init__(
        self,
        spec: GitActuatorSpec,
        *,
        target: str,
        vllm_url: str,
        kube_http: httpx.AsyncClient | None = None,
        forge_http: httpx.AsyncClient | None = None,
        sleep: Sleep = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec
        self.target = target
        self.vllm_url = vllm_url
        self.repo = GitRepo(spec, key=target)
        self.forge: Forge | None = build_forge(spec.forge, http=forge_http) if spec.forge else None
        self.landing = Landing(self.repo, self.forge, spec, sleep=sleep, monotonic=monotonic)
        self._kube_http = kube_http
        self._http: httpx.AsyncClient | None = kube_http
        self._sleep = sleep
        self._monotonic = monotonic
        self._context: ChangeContext | None = None
        self._change_id = f"change-{uuid.uuid4().hex[:10]}"  # without a context
        main = Stage("main", spec.locator, spec.cluster.deployment)
        self.stages = [main]
        if spec.canary_locator is not None and spec.cluster.canary_deployment:
            canary = Stage("canary", spec.canary_locator, spec.cluster.canary_deployment)
            self.stages.insert(0, canary)

    def prepare(self, context: ChangeContext) -> None:
        """Why the next change is made: its commit and pull request say so (TakesContext)."""
        self._context = context

    # --- the Actuator contract ----------------------------------------------------------------

    async def aclose(self) -> None:
        """Nothing to close: git runs per call, the forge and cluster clients per session."""

    async def current(self) -> Deployed:
        """What serves now, and the repository's head it was read at."""
        async with self._session():
            async with self.repo.locked():
                head = await self._sync()
                files = {s.name: await self._file(head, s) for s in self.stages}
            return await self._deployed(head, files)

    async def apply(self, flags: FlagValues) -> Deployed:
        """Commit ``flags`` to the canary's file (the main one without a canary); wait until
        the cluster serves them."""
        return await self._change(self.stages[0], flags)

    async def promote(self, flags: FlagValues) -> Deployed:
        """Commit ``flags`` to the main file too; without a canary there is nothing to do."""
        if len(self.stages) == 1:
            return await self.current()
        return await self._change(self.stages[-1], flags)

    async def rollback(self, before: Deployed) -> Deployed:
        """Undo every commit of this target since ``before``'s head (each once), after closing
        what is still open; wait until the cluster serves what the branch then says (the
        recorded flags, unless someone committed others since: then ActuatorError says so)."""
        head = before.detail.get("head")
        if not isinstance(head, str) or before.detail.get("actuator") != "git":
            raise ActuatorError(
                "cannot roll back: the record was not made by the git actuator (it has no "
                "repository head); restore the flags by hand"
            )
        async with self._session():
            async with self.repo.locked():
                tip, touched = await self._revert_since(head)
                files = {s.name: await self._file(tip, s) for s in self.stages}
            # the cluster serves what the branch says; after the revert that is the record's
            wanted: dict[str, Wanted] = {
                stage.deployment: {k: files[stage.name]["file_flags"].get(k) for k in touched}
                for stage in self.stages
            }
            await self._wait_served(wanted, tip, what=f"the rollback of {self.target}")
            self._refuse_later_edits(before, files, touched)
            return await self._deployed(tip, files)

    async def stage(self, recorded: Deployed) -> Deployed:
        """Commit the flags the main Deployment ran when ``recorded`` was made to the canary's
        file (the main one without a canary); wait until served. A file's edit sets flags and
        removes none: when the stage runs a tunable flag the record has not, ActuatorError says
        so before anything is committed (it would serve a mix of both, not the record)."""
        wanted = _stage_flags(recorded, self.stages[-1])
        stage = self.stages[0]
        async with self._session():
            running = read_flags((await self._container(stage.deployment)).args)
        added = sorted(set(running) - set(wanted))
        if added:
            raise ActuatorError(
                f"cannot serve the recorded flags on Deployment {stage.deployment}: it runs "
                f"{', '.join('--' + name for name in added)}, which the record has not, and the "
                "git actuator sets flags in a file but removes none"
            )
        return await self._change(stage, wanted)

    # --- apply and promote ----------------------------------------------------------------------

    async def _change(self, stage: Stage, flags: FlagValues) -> Deployed:
        context = self._context
        before = context.before if context is not None else None
        async with self._session():
            async with self.repo.locked():
                base = await self._sync()
                if before is not None:
                    await self._refuse_if_changed(stage, before, base)
                text = await self._text(base, stage)
                in_file = Locator(stage.locator).read(text).flags
                reference = (
                    _stage_flags(before, stage)
                    if before is not None
                    else read_flags((await self._container(stage.deployment)).args)
                )
                changes: FlagValues = {
                    canonical(k): v for k, v in flags.items() if reference.get(canonical(k)) != v
                }
                to_write = {k: v for k, v in changes.items() if in_file.get(k) != v}
                tip = base
                if to_write:
                    tip = await self._commit_and_land(stage, base, text, to_write)
                files = {s.name: await self._file(tip, s) for s in self.stages}
            wanted: dict[str, Wanted] = {stage.deployment: dict(changes)}
            await self._wait_served(wanted, tip, what=self._title())
            return await self._deployed(tip, files, serving=stage)

    async def _refuse_if_changed(self, stage: Stage, before: Deployed, base: str) -> None:
        """GitConflict unless the file is as current() read it, but for this change's commits."""
        head = str(before.detail.get("head", ""))
        known = bool(head) and await self.repo.rev(head) is not None
        if not known or not await self.repo.is_ancestor(head, base):
            raise ActuatorError(
                f"the history of {self.spec.branch} no longer contains the commit ruleloop read "
                f"the flags at ({head[:12] or 'none recorded'}): someone rewrote it; nothing was "
                "changed, request the change again"
            )
        others = [
            c for c in await self.repo.log(f"{head}..{base}", paths=[stage.locator.file])
            if c.trailer(trailers.CHANGE) != self._id()
        ]  # fmt: skip
        if others:
            newest = others[0]
            raise ActuatorError(
                f"{stage.locator.file} changed since ruleloop read it: {newest.sha[:12]} "
                f"“{trailers.one_line(newest.subject, limit=80)}”"
                + (f" and {len(others) - 1} more" if len(others) > 1 else "")
                + "; nothing was changed. Request the change again so it starts from what "
                "the file says now"
            )

    async def _commit_and_land(self, stage: Stage, base: str, text: str, flags: FlagValues) -> str:
        """One commit setting ``flags`` in the stage's file, landed; the branch's tip after."""
        new_text = Locator(stage.locator).write(text, flags)
        branch = self._branch(stage.name)
        shown = flags_text(flags)
        subject = f"{self._title()}: {shown}" + (" (canary)" if stage.name == "canary" else "")
        body = self._body(
            f"Sets {shown} in `{stage.locator.file}` ({_where(stage.locator)}), served by "
            f"Deployment {self.spec.cluster.namespace}/{stage.deployment}."
        )
        message = trailers.compose(subject, body, [
            (trailers.CHANGE, self._id()), (trailers.TARGET, self.target),
            (trailers.STAGE, stage.name), (trailers.FLAGS, trailers.flags_value(flags)),
        ])  # fmt: skip
        try:
            await self.repo.start(branch, base)
            await self.repo.write(stage.locator.file, new_text)
            await self.repo.commit(message)
            landed = await self.landing.land(
                Proposal(branch=branch, title=subject, body=body, message=message)
            )
        except GitConflict as exc:
            raise ActuatorError(
                f"{self._title()} was not applied: {exc}. Nothing was left behind (no branch, "
                "no open pull request); request the change again"
            ) from exc
        except GitOpsError as exc:
            raise ActuatorError(f"{self._title()} was not applied: {exc}") from exc
        return landed.tip

    # --- rollback -------------------------------------------------------------------------------

    async def _revert_since(self, head: str) -> tuple[str, set[str]]:
        """Close what is open, revert what landed (once); the branch's tip after, and the flags
        the change's commits touched."""
        touched: set[str] = set()
        for attempt in (1, 2, 3):
            tip = await self._sync()
            if await self.repo.rev(head) is None or not await self.repo.is_ancestor(head, tip):
                raise ActuatorError(
                    f"cannot roll back {self.target}: {self.spec.branch} no longer contains the "
                    f"commit recorded before the change ({head[:12]}), someone rewrote its "
                    "history; restore the flags by hand"
                )
            for branch in await self.repo.remote_branches(f"ruleloop/{_slug(self.target)}/"):
                await self.landing.abandon(branch)  # a pull request a dead replica left open
            ours = [
                c for c in await self.repo.log(f"{head}..{tip}")
                if c.trailer(trailers.TARGET) == self.target and c.trailer(trailers.CHANGE)
            ]  # fmt: skip
            reverted = {sha for c in ours for sha in c.trailers.get(trailers.REVERT_OF, [])}
            fixes = [c for c in ours if trailers.REVERT_OF not in c.trailers]
            for commit in fixes:
                touched |= set(trailers.read_flags_value(commit.trailer(trailers.FLAGS) or "{}"))
            todo = [c for c in fixes if c.sha not in reverted]
            if not todo:
                return tip, touched
            try:
                return await self._land_revert(tip, todo), touched
            except GitConflict as exc:
                if "reverts cleanly" in str(exc) or attempt == 3:
                    raise ActuatorError(
                        f"cannot roll back {self.target}: {exc}. Nothing was pushed; revert "
                        + ", ".join(c.sha[:12] for c in todo)
                        + f" on {self.spec.branch} by hand"
                    ) from exc
            except GitOpsError as exc:
                raise ActuatorError(f"the rollback of {self.target} failed: {exc}") from exc
        raise AssertionError("unreachable: the third attempt returns or raises")

    def _refuse_later_edits(
        self, before: Deployed, files: Mapping[str, Mapping[str, Any]], touched: set[str]
    ) -> None:
        """ActuatorError when, ruleloop's commits reverted, the branch still sets other values
        than it did before the change: someone committed them since (they are kept)."""
        for stage in self.stages:
            kept = before.detail.get(stage.name)
            was = kept.get("file_flags") if isinstance(kept, Mapping) else None
            if not isinstance(was, Mapping):
                continue
            now = files[stage.name]["file_flags"]
            moved = {k: now.get(k) for k in sorted(touched) if now.get(k) != was.get(k)}
            if moved:
                recorded = {k: was.get(k) for k in moved}
                raise ActuatorError(
                    f"ruleloop's commits on {self.target} are reverted, but {self.spec.branch} "
                    f"now sets {_wanted_text(moved)} in {stage.locator.file}, not the recorded "
                    f"{_wanted_text(recorded)}: someone committed that since, and the cluster "
                    f"serves it. Check the file's history (`git log -- {stage.locator.file}`)"
                )

    async def _land_revert(self, tip: str, todo: list[Commit]) -> str:
        branch = self._branch("revert")
        await self.repo.start(branch, tip)
        await self.repo.revert([c.sha for c in todo])
        if not await self.repo.staged():  # someone reverted it by hand, differently
            return tip
        context = self._context
        # without a context, what it reverts names it: "ADR-… on prod-a" of the fix's subject
        named = todo[-1].subject.split(": ", 1)[0] if context is None else self._title()
        subject = f"ruleloop: revert {named}"
        listed = "\n".join(
            f"- {c.sha[:12]} “{trailers.one_line(c.subject, limit=80)}”" for c in todo
        )
        reason = context.reason if context is not None and context.reason else ""
        body = self._body(
            (f"Why: {trailers.one_line(reason, limit=400)}\n\n" if reason else "")
            + f"This reverts:\n{listed}"
        )
        pairs = [(trailers.CHANGE, self._id()), (trailers.TARGET, self.target)]
        pairs += [(trailers.REVERT_OF, c.sha) for c in todo]
        message = trailers.compose(subject, body, pairs)
        await self.repo.commit(message)
        landed = await self.landing.land(
            Proposal(branch=branch, title=subject, body=body, message=message)
        )
        return landed.tip

    # --- waiting until the cluster serves it ------------------------------------------------------

    async def _wait_served(self, wanted: dict[str, Wanted], commit: str, *, what: str) -> None:
        """Poll until the GitOps tool deployed ``commit`` (or later) and each Deployment runs
        the wanted flags with its rollout complete; ActuatorError after rollout_timeout_s."""
        deadline = self._monotonic() + self.spec.rollout_timeout_s
        while True:
            waiting = await self._served_waiting(wanted, commit)
            if waiting is None:
                return
            if self._monotonic() >= deadline:
                raise ActuatorError(
                    f"{what} is on {self.spec.branch} (commit {commit[:12]}), but the cluster "
                    f"does not serve it after {self.spec.rollout_timeout_s:g} s: still waiting "
                    f"for {waiting}. Check the {self._tool()}"
                )
            await self._sleep(self.spec.poll_interval_s)

    async def _served_waiting(self, wanted: dict[str, Wanted], commit: str) -> str | None:
        if self.spec.sync is not None:
            assert self._http is not None
            waiting = await sync_status.waiting(
                self._http, self.spec.sync, commit, lambda rev: self._contains(commit, rev)
            )
            if waiting is not None:
                return waiting
        for name, flags in wanted.items():
            obj = await self._get_deployment(name)
            where = f"{self.spec.cluster.namespace}/{name}"
            found = kube_read.find_container(obj, where=where, wanted=self.spec.cluster.container)
            live = read_flags(found.args)
            wrong = {k: v for k, v in flags.items() if live.get(k) != v}
            if wrong:
                running = {k: live.get(k) for k in wrong}
                return (
                    f"Deployment {where} to run {_wanted_text(wrong)} (it runs "
                    f"{_wanted_text(running)})"
                )
            rollout = kube_read.rollout_waiting(obj, 0)
            if rollout is not None:
                return f"Deployment {where}: {rollout}"
        return None

    async def _contains(self, commit: str, revision: str) -> bool:
        """Whether the tool's ``revision`` holds ``commit``: it is, or descends from it."""
        if revision == commit:
            return True
        async with self.repo.locked():
            return await self._holds(commit, revision)

    async def _holds(self, commit: str, revision: str) -> bool:
        if revision == commit:
            return True
        if not all(c in "0123456789abcdef" for c in revision.lower()) or len(revision) < 7:
            return False  # not a commit (a chart version): it cannot hold one
        if await self.repo.rev(revision) is None:
            await self._sync()  # someone pushed after ruleloop: fetch it
            if await self.repo.rev(revision) is None:
                return False
        return await self.repo.is_ancestor(commit, revision)

    # --- reading --------------------------------------------------------------------------------

    async def _sync(self) -> str:
        try:
            return await self.repo.sync()
        except GitOpsError as exc:
            raise ActuatorError(str(exc)) from exc

    async def _text(self, rev: str, stage: Stage) -> str:
        try:
            text = await self.repo.show(rev, stage.locator.file)
        except GitOpsError as exc:
            raise ActuatorError(str(exc)) from exc
        if text is None:
            raise ActuatorError(
                f"{stage.locator.file} is not on {self.spec.branch} of {scrub(self.spec.repo_url)}"
                ": check `file` in the target's locator"
            )
        return text

    async def _file(self, rev: str, stage: Stage) -> dict[str, Any]:
        """What the record keeps of a stage's file at ``rev`` (tunable flags only)."""
        text = await self._text(rev, stage)
        found = Locator(stage.locator).read(text)
        return {
            "file": stage.locator.file,
            "blob": await self.repo.blob(rev, stage.locator.file),
            "file_flags": dict(found.flags),
        }

    async def _deployed(
        self, head: str, files: Mapping[str, dict[str, Any]], *, serving: Stage | None = None
    ) -> Deployed:
        """The record: the head, each stage's file and live Deployment (argv.record only)."""
        detail: dict[str, Any] = {
            "actuator": "git",
            "repo": scrub(self.spec.repo_url),
            "branch": self.spec.branch,
            "head": head,
            "deployment": self.spec.cluster.deployment,
        }
        shown: FlagValues = {}
        for stage in self.stages:
            found = await self._container(stage.deployment)
            live = read_flags(found.args)
            detail[stage.name] = {
                **files[stage.name],
                "deployment": stage.deployment,
                "argv": record(found.args),
                "flags": dict(live),
                "generation": found.generation,
            }
            if stage is (serving or self.stages[-1]):
                shown = live
        canary = len(self.stages) > 1 and self.spec.canary_url
        base_url = self.spec.canary_url if canary and self.spec.canary_url else self.vllm_url
        return Deployed(flags=shown, base_url=base_url, detail=detail)

    async def _container(self, name: str) -> kube_read.Container:
        obj = await self._get_deployment(name)
        where = f"{self.spec.cluster.namespace}/{name}"
        return kube_read.find_container(obj, where=where, wanted=self.spec.cluster.container)

    async def _get_deployment(self, name: str) -> dict[str, Any]:
        assert self._http is not None
        namespace = self.spec.cluster.namespace

        def describe(code: int, message: str) -> str:
            if code == 401:
                return (
                    f"the Kubernetes API at {self.spec.cluster.api_url} refused ruleloop's "
                    f"credentials (401 {message}): check the service-account token "
                    f"({self.spec.cluster.token_file or 'no token_file set'})"
                )
            if code == 403:
                return (
                    f"the service account lacks RBAC permission to get deployments in "
                    f"namespace {namespace} (403: {message}); grant get on deployments.apps, "
                    "see docs/remediation-gitops.md"
                )
            if code == 404:
                return (
                    f"Deployment {name} does not exist in namespace {namespace} (404: {message})"
                    "; check [cluster] in the target's actuator settings"
                )
            return f"the Kubernetes API answered {code} to GET Deployment {namespace}/{name}"

        return await kube_read.request_json(
            self._http, "GET", kube_read.deployment_path(namespace, name),
            what=f"Deployment {namespace}/{name}", describe=describe,
        )  # fmt: skip

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[None]:
        """One operation: a Kubernetes API client for it (none is kept between them), and
        git's and the forge's errors as ActuatorError, which the service rolls back on."""
        try:
            if self._http is not None:
                yield
                return
            cluster = self.spec.cluster
            async with kube_read.client(
                cluster.api_url, token_file=cluster.token_file, ca_file=cluster.ca_file
            ) as http:
                self._http = http
                try:
                    yield
                finally:
                    self._http = self._kube_http
        except GitOpsError as exc:
            raise ActuatorError(str(exc)) from exc

    # --- words ----------------------------------------------------------------------------------

    def _id(self) -> str:
        return self._context.change_id if self._context is not None else self._change_id

    def _title(self) -> str:
        if self._context is not None and self._context.title:
            return trailers.one_line(self._context.title, limit=80)
        return f"ruleloop change on {self.target}"

    def _branch(self, stage: str) -> str:
        return f"ruleloop/{_slug(self.target)}/{_slug(self._id())}/{stage}"

    def _body(self, what: str) -> str:
        context = self._context.description.strip() if self._context is not None else ""
        tail = (
            "Opened by ruleloop, which merges it itself (the approvals were collected in "
            "Slack) and reverts it with a new commit if the canary fails; it never "
            "force-pushes."
        )
        return "\n\n".join(part for part in (context, what, tail) if part)

    def _tool(self) -> str:
        sync = self.spec.sync
        if sync is None:
            return f"Deployment's events (`kubectl -n {self.spec.cluster.namespace} describe`)"
        if sync.kind == "argocd":
            return f"Argo CD Application {sync.namespace}/{sync.application} (sync, health)"
        return f"Flux Kustomization {sync.namespace}/{sync.kustomization} (`flux get ks`)"


def _stage_flags(before: Deployed, stage: Stage) -> FlagValues:
    """The flags a stage's Deployment ran when ``before`` was recorded."""
    kept = before.detail.get(stage.name)
    if isinstance(kept, Mapping) and isinstance(kept.get("flags"), Mapping):
        return dict(kept["flags"])
    return dict(before.flags)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text).strip(".-") or "x"


def _where(locator: GitLocatorSpec) -> str:
    return (
        f"args at {locator.args}"
        if locator.args
        else "values at " + ", ".join(f"{k}: {v}" for k, v in locator.flags.items())
    )


def _wanted_text(flags: Mapping[str, Any]) -> str:
    return " ".join(
        f"--{k}={v}" if v is not None else f"no --{k}" for k, v in sorted(flags.items())
    )
