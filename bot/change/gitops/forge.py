"""Pull requests through the forge's REST API: GitHub's pulls, GitLab's merge requests.

One interface for both (``Forge``): open a pull request from a branch, find the open one of a
branch (a bot restarted mid-change finds what it left), say what a merge still waits for
(reviews, checks), merge it at exactly the commit ruleloop pushed, close it. The answers that
mean "someone else changed it first" become ``GitConflict``: GitHub 405 (not mergeable) and 409
(the head moved), GitLab 405/406 (cannot be merged) and 409 (the sha does not match).

The token is read from its file for every request and sent in a header (GitHub: ``Authorization:
Bearer``, GitLab: ``PRIVATE-TOKEN``); it is never part of a URL, a message or a log line.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from bot.change.gitops.errors import GitConflict, GitOpsError
from bot.change.gitops.secrets import read_secret, refuse_plain_http, scrub
from bot.kernel import ForgeSpec

DEFAULT_API = {"github": "https://api.github.com", "gitlab": "https://gitlab.com/api/v4"}
SCOPES = {
    "github": "a fine-grained token with Contents and Pull requests: Read and write",
    "gitlab": "a project or personal token with the api scope",
}


@dataclass(frozen=True)
class PullRequest:
    """A pull request (GitHub) or merge request (GitLab), as ruleloop needs it."""

    number: int  # GitHub's number, GitLab's iid
    url: str  # the page people open
    head: str  # the source branch
    head_sha: str
    state: str  # "open", "closed" or "merged"


class Forge(Protocol):
    """What ruleloop does with pull requests, on GitHub or GitLab."""

    kind: str

    async def open(self, *, head: str, base: str, title: str, body: str) -> PullRequest:
        """Open one from ``head`` into ``base`` (the open one of ``head`` if there is one)."""
        ...

    async def find_open(self, head: str) -> PullRequest | None:
        """The open pull request of branch ``head``, if any."""
        ...

    async def waiting(self, pr: PullRequest) -> str | None:
        """What a merge still waits for (reviews, checks), None when it may merge now;
        GitConflict when it cannot merge at all."""
        ...

    async def merge(self, pr: PullRequest, *, sha: str, squash: bool, message: str) -> None:
        """Merge exactly ``sha`` (else GitConflict) as a rebase, or one squashed commit whose
        message is ``message``."""
        ...

    async def close(self, pr: PullRequest) -> None:
        """Close it unmerged."""
        ...


class _TokenHeader(httpx.Auth):
    def __init__(self, spec: ForgeSpec) -> None:
        self.spec = spec

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        refuse_plain_http(str(request.url), f"{self.spec.kind} token")
        token = read_secret(self.spec.token_file, f"{self.spec.kind} token")
        if self.spec.kind == "gitlab":
            request.headers["PRIVATE-TOKEN"] = token
        else:
            request.headers["Authorization"] = f"Bearer {token}"
        yield request


def build_forge(spec: ForgeSpec, *, http: httpx.AsyncClient | None = None) -> Forge:
    """The forge client the settings describe."""
    if spec.kind == "gitlab":
        return GitLab(spec, http=http)
    return GitHub(spec, http=http)


class _Rest:
    """Requests with the token, and error answers as messages that say what to do."""

    kind = ""
    name = ""

    def __init__(self, spec: ForgeSpec, *, http: httpx.AsyncClient | None) -> None:
        self.spec = spec
        self.api_url = (spec.api_url or DEFAULT_API[spec.kind]).rstrip("/")
        self._http = http  # None: a client per request (actuators are built per step)
        self._auth = _TokenHeader(spec)

    def _secrets(self) -> list[str]:
        with contextlib.suppress(GitOpsError):
            return [read_secret(self.spec.token_file, "token")]
        return []

    async def _call(
        self, method: str, path: str, *, body: Any = None, params: dict[str, str] | None = None,
        ok: tuple[int, ...] = (200, 201),
    ) -> tuple[int, Any, str]:  # fmt: skip
        """(status, JSON body, the forge's message); statuses outside ``ok`` and 401/403/404
        raise GitOpsError; the caller decides about the others it lists in ``ok``."""
        url = f"{self.api_url}{path}"
        try:
            async with contextlib.AsyncExitStack() as stack:
                http = self._http
                if http is None:
                    http = await stack.enter_async_context(
                        httpx.AsyncClient(timeout=httpx.Timeout(30.0))
                    )
                response = await http.request(
                    method, url, json=body, params=params, auth=self._auth,
                    headers=self._headers(),
                )  # fmt: skip
        except httpx.HTTPError as exc:
            raise GitOpsError(
                scrub(f"cannot reach {self.name}'s API at {self.api_url}: "
                      f"{type(exc).__name__}: {exc}", self._secrets())
            ) from None  # fmt: skip
        try:
            data: Any = response.json()
        except ValueError:
            data = None
        # a forge or a proxy may echo the token: scrubbed before it is cut (never half a token)
        message = scrub(_message(data) or response.reason_phrase, self._secrets())[:300]
        if response.status_code in ok:
            return response.status_code, data, message
        code = response.status_code
        where = f"{self.spec.project} ({method} {path.split('?')[0]})"
        if code == 401:
            raise GitOpsError(
                f"{self.name} refused the token in {self.spec.token_file} (401 {message}): it "
                f"is wrong or expired; put a valid one there ({SCOPES[self.kind]})"
            )
        if code == 403:
            raise GitOpsError(
                f"{self.name} says the token may not do this on {where} (403 {message}): it "
                f"needs {SCOPES[self.kind]} on {self.spec.project}"
            )
        if code == 404:
            raise GitOpsError(
                f"{self.name} does not know {where} (404 {message}): check `project` in "
                f"[forge], and that the token can see the repository ({SCOPES[self.kind]})"
            )
        raise GitOpsError(scrub(f"{self.name} answered {code} to {method} {where}: {message}"))

    def _headers(self) -> dict[str, str]:
        return {"Accept": "application/json"}


class GitHub(_Rest):
    """GitHub's REST API (github.com or GitHub Enterprise's /api/v3)."""

    kind = "github"
    name = "GitHub"

    def __init__(self, spec: ForgeSpec, *, http: httpx.AsyncClient | None = None) -> None:
        super().__init__(spec, http=http)
        owner, _, repo = spec.project.partition("/")
        if not owner or not repo or "/" in repo:
            raise GitOpsError(
                f"GitHub project {spec.project!r} is not owner/repo (e.g. acme/fleet): fix "
                "`project` in [forge]"
            )
        self.owner, self.repo = owner, repo
        self._base = f"/repos/{quote(owner, safe='')}/{quote(repo, safe='')}"

    def _headers(self) -> dict[str, str]:
        return {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}

    async def open(self, *, head: str, base: str, title: str, body: str) -> PullRequest:
        code, data, message = await self._call(
            "POST", f"{self._base}/pulls", ok=(201, 422),
            body={"title": title, "head": head, "base": base, "body": body},
        )  # fmt: skip
        if code == 422:
            existing = await self.find_open(head)
            if existing is not None:
                return existing
            raise GitOpsError(f"GitHub did not open the pull request from {head}: {message}")
        return _github_pr(data)

    async def find_open(self, head: str) -> PullRequest | None:
        _, data, _ = await self._call(
            "GET", f"{self._base}/pulls",
            params={"head": f"{self.owner}:{head}", "state": "open"},
        )  # fmt: skip
        found = [_github_pr(item) for item in data or [] if item["head"]["ref"] == head]
        return found[0] if found else None

    async def waiting(self, pr: PullRequest) -> str | None:
        _, data, _ = await self._call("GET", f"{self._base}/pulls/{pr.number}")
        state = data.get("mergeable_state")
        if data.get("merged") or state in ("clean", "unstable", "has_hooks"):
            return None
        if state == "dirty" or data.get("mergeable") is False and state != "blocked":
            raise GitConflict(f"pull request {pr.url} has conflicts with its base branch")
        if state == "blocked":
            return f"the reviews or checks the branch's rules require on {pr.url}"
        return f"GitHub to compute whether {pr.url} can merge ({state or 'unknown'})"

    async def merge(self, pr: PullRequest, *, sha: str, squash: bool, message: str) -> None:
        title, _, rest = message.partition("\n")
        code, _, said = await self._call(
            "PUT", f"{self._base}/pulls/{pr.number}/merge", ok=(200, 405, 409),
            body={"sha": sha, "merge_method": "squash" if squash else "rebase",
                  "commit_title": title, "commit_message": rest.strip("\n")},
        )  # fmt: skip
        if code == 405:
            raise GitConflict(f"GitHub will not merge {pr.url} (405 {said})")
        if code == 409:
            raise GitConflict(
                f"the branch of {pr.url} changed since ruleloop pushed it (409 {said})"
            )

    async def close(self, pr: PullRequest) -> None:
        await self._call("PATCH", f"{self._base}/pulls/{pr.number}", body={"state": "closed"})


class GitLab(_Rest):
    """GitLab's REST API v4 (gitlab.com or a self-managed instance)."""

    kind = "gitlab"
    name = "GitLab"

    def __init__(self, spec: ForgeSpec, *, http: httpx.AsyncClient | None = None) -> None:
        super().__init__(spec, http=http)
        self._base = f"/projects/{quote(spec.project, safe='')}"

    async def open(self, *, head: str, base: str, title: str, body: str) -> PullRequest:
        code, data, message = await self._call(
            "POST", f"{self._base}/merge_requests", ok=(201, 409),
            body={"source_branch": head, "target_branch": base, "title": title,
                  "description": body, "remove_source_branch": True},
        )  # fmt: skip
        if code == 409:
            existing = await self.find_open(head)
            if existing is not None:
                return existing
            raise GitOpsError(f"GitLab did not open the merge request from {head}: {message}")
        return _gitlab_mr(data)

    async def find_open(self, head: str) -> PullRequest | None:
        _, data, _ = await self._call(
            "GET", f"{self._base}/merge_requests",
            params={"source_branch": head, "state": "opened"},
        )  # fmt: skip
        found = [_gitlab_mr(item) for item in data or [] if item["source_branch"] == head]
        return found[0] if found else None

    async def waiting(self, pr: PullRequest) -> str | None:
        _, data, _ = await self._call("GET", f"{self._base}/merge_requests/{pr.number}")
        status = data.get("detailed_merge_status") or data.get("merge_status")
        if data.get("state") == "merged" or status in ("mergeable", "can_be_merged"):
            return None
        if status in ("conflict", "need_rebase", "cannot_be_merged"):
            raise GitConflict(f"merge request {pr.url} cannot be merged ({status})")
        if status in ("not_approved", "blocked_status", "discussions_not_resolved"):
            return f"the approvals the project requires on {pr.url} ({status})"
        return f"GitLab to check {pr.url} ({status or 'unknown'})"

    async def merge(self, pr: PullRequest, *, sha: str, squash: bool, message: str) -> None:
        body: dict[str, Any] = {"sha": sha, "should_remove_source_branch": True, "squash": squash}
        if squash:
            body["squash_commit_message"] = message
        code, _, said = await self._call(
            "PUT", f"{self._base}/merge_requests/{pr.number}/merge", ok=(200, 405, 406, 409),
            body=body,
        )  # fmt: skip
        if code in (405, 406):
            raise GitConflict(f"GitLab will not merge {pr.url} ({code} {said})")
        if code == 409:
            raise GitConflict(
                f"the branch of {pr.url} changed since ruleloop pushed it (409 {said})"
            )

    async def close(self, pr: PullRequest) -> None:
        await self._call(
            "PUT", f"{self._base}/merge_requests/{pr.number}", body={"state_event": "close"}
        )


def _github_pr(data: Any) -> PullRequest:
    state = "merged" if data.get("merged") else str(data.get("state", "open"))
    return PullRequest(
        number=int(data["number"]), url=str(data.get("html_url", "")),
        head=str(data["head"]["ref"]), head_sha=str(data["head"]["sha"]), state=state,
    )  # fmt: skip


def _gitlab_mr(data: Any) -> PullRequest:
    state = {"opened": "open"}.get(str(data.get("state")), str(data.get("state")))
    return PullRequest(
        number=int(data["iid"]), url=str(data.get("web_url", "")),
        head=str(data["source_branch"]), head_sha=str(data.get("sha", "")), state=state,
    )  # fmt: skip


def _message(data: Any) -> str:
    """The forge's own words: GitHub's ``message``, GitLab's ``message`` or ``error`` (whole:
    the caller scrubs and cuts them)."""
    if not isinstance(data, dict):
        return ""
    for key in ("message", "error"):
        value = data.get(key)
        if value:
            return value if isinstance(value, str) else json.dumps(value)
    return ""
