"""One commit onto the team's branch: a pull request ruleloop merges, or a direct push.

``land`` takes the clone's HEAD (one commit on top of the fetched target branch) there:

    direct_push   git push HEAD:<branch>, never forced; refused as not a fast-forward: Conflict
    forge         push the change's own branch, open a pull request, wait for the forge's
                  approvals when configured, merge exactly the pushed sha (rebase or squash:
                  history stays linear), delete the branch

A merge the forge refuses (conflicts, the head moved, approvals missing past the timeout) or
any other failure before the merge closes the pull request and deletes the branch before the
error is raised: nothing is left half done. ``abandon`` does that cleanup on its own, for a
bot that finds a branch a killed replica left behind.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bot.change.gitops.errors import GitOpsError
from bot.change.gitops.forge import Forge, PullRequest
from bot.change.gitops.git import GitRepo
from bot.change.gitops.secrets import scrub
from bot.kernel import GitRepoSpec

log = logging.getLogger("ruleloop.gitops")
Sleep = Callable[[float], Awaitable[None]]
APPROVAL_POLL_S = 15.0


@dataclass(frozen=True)
class Proposal:
    """What one change says where people review it."""

    branch: str  # the change's own branch, ruleloop/<target>/<change>/<stage>
    title: str  # the pull request's title
    body: str  # its description (Markdown)
    message: str  # the commit's whole message (a squash merge writes it)


@dataclass(frozen=True)
class Landed:
    """Where a change landed: the target branch's head after it, and its pull request."""

    tip: str
    pull_request: str | None = None


class Landing:
    """Lands commits through ``forge`` (or by direct push) on ``spec``'s branch."""

    def __init__(
        self,
        repo: GitRepo,
        forge: Forge | None,
        spec: GitRepoSpec,
        *,
        sleep: Sleep = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.repo = repo
        self.forge = forge
        self.spec = spec
        self._sleep = sleep
        self._monotonic = monotonic

    async def land(self, proposal: Proposal) -> Landed:
        """Land the clone's HEAD; Conflict (nothing left behind) when someone was first."""
        head = await self.repo.rev("HEAD")
        assert head is not None
        if self.spec.direct_push or self.forge is None:
            await self.repo.push("HEAD", self.spec.branch)
            return Landed(tip=head)
        await self.repo.delete_branch(proposal.branch)  # one an earlier try left: start clean
        await self.repo.push("HEAD", proposal.branch)
        pr: PullRequest | None = None
        try:
            pr = await self.forge.open(
                head=proposal.branch, base=self.spec.branch, title=proposal.title,
                body=proposal.body,
            )  # fmt: skip
            await self._approved(pr)
            squash = self.spec.forge is not None and self.spec.forge.merge_method == "squash"
            await self.forge.merge(pr, sha=head, squash=squash, message=proposal.message)
        except (GitOpsError, asyncio.CancelledError):
            await self.abandon(proposal.branch, pr)
            raise
        await self._quietly(self.repo.delete_branch(proposal.branch), proposal.branch)
        tip = await self.repo.sync()
        return Landed(tip=tip, pull_request=pr.url)

    async def propose(self, proposal: Proposal) -> PullRequest:
        """Push the clone's HEAD to the proposal's branch and open a pull request that people
        review and merge (the branch's open one when there is one already)."""
        if self.forge is None:
            raise GitOpsError("no [forge] is configured to open a pull request with")
        existing = await self.forge.find_open(proposal.branch)
        if existing is not None:
            return existing
        await self.repo.delete_branch(proposal.branch)
        await self.repo.push("HEAD", proposal.branch)
        try:
            return await self.forge.open(
                head=proposal.branch, base=self.spec.branch, title=proposal.title,
                body=proposal.body,
            )  # fmt: skip
        except GitOpsError:
            await self.abandon(proposal.branch)
            raise

    async def abandon(self, branch: str, pr: PullRequest | None = None) -> None:
        """Close ``branch``'s open pull request and delete the branch; a failure here is
        logged, never raised over the reason for abandoning."""
        if self.forge is not None:
            try:
                if pr is None or pr.state != "open":
                    pr = await self.forge.find_open(branch)
                if pr is not None and pr.state == "open":
                    await self.forge.close(pr)
                    log.info("closed pull request %s (%s)", pr.url, branch)
            except GitOpsError as exc:
                log.warning("could not close the pull request of %s: %s", branch, exc)
        await self._quietly(self.repo.delete_branch(branch), branch)

    async def _approved(self, pr: PullRequest) -> None:
        """With ``approvals = "forge"``: wait until the forge's own rules allow the merge."""
        forge = self.spec.forge
        if forge is None or forge.approvals != "forge" or self.forge is None:
            return
        deadline = self._monotonic() + forge.approval_timeout_s
        while (waiting := await self.forge.waiting(pr)) is not None:
            if self._monotonic() >= deadline:
                raise GitOpsError(
                    f"{pr.url} was not approved within {_duration(forge.approval_timeout_s)} "
                    f"(still waiting for {waiting}): ruleloop closed it and changed "
                    "nothing; ask a reviewer first, then request the change again"
                )
            await self._sleep(min(APPROVAL_POLL_S, forge.approval_timeout_s / 10))

    async def _quietly(self, work: Awaitable[None], branch: str) -> None:
        try:
            await work
        except GitOpsError as exc:
            log.warning("could not delete branch %s: %s", branch, scrub(str(exc)))


def _duration(seconds: float) -> str:
    return f"{seconds:g} s" if seconds < 120 else f"{seconds / 60:.0f} min"
