"""An accepted ADR as a pull request into the team's ``adr/`` directory (``[adr_publish]``).

Accepting a draft in Slack makes it the rule in the store at once; the team's repository is
where the decisions are read and kept for years, so the accepted file should land there too,
reviewed like any other change. ``AdrPublisher.publish`` opens one pull request per ADR (branch
``ruleloop/adr/<id>``) that adds ``<directory>/<name>`` byte for byte as the store holds it and
removes a draft of the same id from ``<directory>/drafts/`` (as ``ruleloop adr export`` does);
people merge it. With ``direct_push = true`` the commit goes straight to the branch.

It is idempotent: an open pull request of the ADR is returned as it is, and a file already
on the branch with that content is "nothing to publish". The commit carries the trailer
``Ruleloop-Adr: <id>``. ``publish_accepted`` is the review flow's one call: the line the
draft's card adds, a failure said rather than raised (the decision already stands).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

from bot.adr import file_id
from bot.change.gitops import trailers
from bot.change.gitops.errors import GitOpsError
from bot.change.gitops.forge import build_forge
from bot.change.gitops.git import GitRepo
from bot.change.gitops.landing import Landing, Proposal
from bot.kernel import AdrPublishSettings

Sleep = Callable[[float], Awaitable[None]]
log = logging.getLogger("ruleloop.gitops")


class StoredAdr(Protocol):
    """What publishing needs of a stored record (``bot.kernel.store.models.AdrRecord`` has it)."""

    adr_id: str
    name: str
    draft: bool
    text: str


@dataclass(frozen=True)
class Published:
    """Where an ADR went: its pull request, or the commit of a direct push, and a line for
    the draft's card."""

    note: str
    pull_request: str | None = None
    commit: str | None = None


class AdrPublisher:
    """Opens the pull request that adds an accepted ADR to the team's repository."""

    def __init__(
        self,
        spec: AdrPublishSettings,
        *,
        forge_http: httpx.AsyncClient | None = None,
        sleep: Sleep = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec
        self.repo = GitRepo(spec, key="adr")
        forge = build_forge(spec.forge, http=forge_http) if spec.forge is not None else None
        self.landing = Landing(self.repo, forge, spec, sleep=sleep, monotonic=monotonic)

    async def publish(self, record: StoredAdr, *, reviewer: str) -> Published:
        """Propose ``record``'s file for ``directory``; GitOpsError says why it could not."""
        if record.draft:
            raise GitOpsError(f"{record.adr_id} is still a draft: only accepted ADRs are published")
        name = record.name
        if "/" in name or "\\" in name or file_id(Path(name)) != record.adr_id:
            raise GitOpsError(
                f"{record.adr_id}: the stored file name {name!r} is not a file name of that ADR "
                "(ADR-…-slug.md): nothing was published"
            )
        path = f"{self.spec.directory}/{name}"
        branch = f"ruleloop/adr/{record.adr_id}"
        async with self.repo.locked():
            tip = await self.repo.sync()
            drafts = await self._drafts_of(tip, record.adr_id)
            if await self.repo.show(tip, path) == record.text and not drafts:
                return Published(note=f"{path} is already on {self.spec.branch}.")
            title = f"{record.adr_id}: {_title(record.text) or 'accepted decision'}"
            removes = ", ".join(f"`{d}`" for d in drafts)
            body = (
                f"Accepted in Slack by {reviewer}; ruleloop applies it from its store already. "
                f"This adds `{path}` as the store holds it"
                + (f" and removes the draft {removes}" if drafts else "")
                + ", so the decision is kept with the team's other ADRs."
            )
            message = trailers.compose(title, body, [(trailers.ADR, record.adr_id)])
            await self.repo.start(branch, tip)
            await self.repo.write(path, record.text)
            for draft in drafts:
                await self.repo.remove(draft)
            await self.repo.commit(message)
            proposal = Proposal(branch=branch, title=title, body=body, message=message)
            if self.spec.direct_push:
                landed = await self.landing.land(proposal)
                return Published(
                    note=f"Committed {path} to {self.spec.branch} ({landed.tip[:12]}).",
                    commit=landed.tip,
                )
            pr = await self.landing.propose(proposal)
        return Published(note=f"Pull request for {path}: {pr.url}", pull_request=pr.url)

    async def _drafts_of(self, tip: str, adr_id: str) -> list[str]:
        """Files under ``<directory>/drafts/`` that carry ``adr_id``."""
        where = f"{tip}:{self.spec.directory}/drafts"
        if await self.repo.rev_quiet(where) is None:
            return []
        out = await self.repo.run("ls-tree", "--name-only", where)
        return [
            f"{self.spec.directory}/drafts/{name}"
            for name in out.splitlines()
            if file_id(Path(name)) == adr_id
        ]


async def publish_accepted(
    spec: AdrPublishSettings | None,
    row: Callable[[str], StoredAdr | None],
    adr_id: str,
    *,
    reviewer: str,
) -> str:
    """What the draft's card adds after an Accept: where the ADR went (" Pull request: ...");
    "" without ``[adr_publish]``. A failure is said, never raised: the decision stands in the
    store whatever git does. ``row`` reads the stored record (``SharedAdrStore.row``)."""
    if spec is None:
        return ""
    record = await asyncio.to_thread(row, adr_id)
    if record is None:
        return f" {adr_id} is not in the store: nothing was published."
    try:
        published = await AdrPublisher(spec).publish(record, reviewer=reviewer)
    except GitOpsError as exc:
        log.warning("publishing %s failed: %s", adr_id, exc)
        return f" It could not be proposed to {spec.branch} of the team's repository: {exc}"
    return f" {published.note}"


def _title(text: str) -> str:
    """The ADR's title: its front matter's ``title:``, else its first heading."""
    match = re.search(r"^title:\s*[\"']?(.+?)[\"']?\s*$", text, flags=re.M) or re.search(
        r"^#\s+(.+?)\s*$", text, flags=re.M
    )
    return trailers.one_line(match[1], limit=80) if match else ""
