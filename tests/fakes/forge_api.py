"""GitHub's and GitLab's pull-request REST APIs faked at the wire, merging in a real bare repo.

A real HTTP server on 127.0.0.1 (in a thread, so a bot in this process or in a `ruleloop serve`
subprocess reaches it). GitHub under ``/github`` (``github_api``), GitLab under
``/gitlab/api/v4`` (``gitlab_api``), one ``project`` each, both over the same bare repository:

    GitHub  POST   /repos/{o}/{r}/pulls                 201; 422 no such head / already exists
            GET    /repos/{o}/{r}/pulls?head=o:b&state= list
            GET    /repos/{o}/{r}/pulls/{n}             mergeable_state clean | blocked
            PUT    /repos/{o}/{r}/pulls/{n}/merge       200 merged; 405 not mergeable (conflict,
                                                        approvals missing, base moved while
                                                        merging, not open); 409 head changed
            PATCH  /repos/{o}/{r}/pulls/{n}             {"state": "closed"}
    GitLab  POST   /projects/{id}/merge_requests        201; 409 one is open for the branch
            GET    /projects/{id}/merge_requests?source_branch=&state=
            GET    /projects/{id}/merge_requests/{iid}  detailed_merge_status mergeable | ...
            PUT    /projects/{id}/merge_requests/{iid}/merge   200; 405 not mergeable (approvals,
                                                        not open); 406 cannot be merged (not a
                                                        fast-forward: the project merges ff
                                                        only); 409 sha does not match
            PUT    /projects/{id}/merge_requests/{iid}  {"state_event": "close"}

Merging is done with git in the bare repository, as the forges do it: GitHub's rebase merge
re-creates each commit on the base with GitHub as committer (new shas, even when a
fast-forward was possible), its squash makes one commit with the given message; GitLab
fast-forwards (same sha), its squash makes one commit. Wrong or missing tokens are 401 with the
forges' own bodies. Every request is recorded (``calls``), with its headers, so a test can
check which credentials were sent where.

``before_merge`` callbacks run (once each) as a merge request arrives: a teammate's push to
the base or to the pull request's branch, to get the 405/406/409 a forge answers then.
``hold(event, when)`` stops the next ``create`` or ``merge`` request for a test to act (kill
the bot that sent it): ``when="before"`` the work is not done (the request is lost),
``when="after"`` it is done and only the answer is held.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FORGE_TOKEN = "ghp_fake-forge-token-0123456789abcdef"
OWNER, REPO = "acme", "fleet"
GITLAB_PROJECT = "acme/fleet"


@dataclass
class Call:
    """One request the fake answered."""

    method: str
    path: str
    status: int
    body: Any
    headers: dict[str, str]


@dataclass
class Pull:
    """A pull request (GitHub) or merge request (GitLab)."""

    kind: str
    number: int
    head: str
    base: str
    title: str
    body: str
    state: str = "open"  # open | closed | merged
    approvals: int = 0
    merge_sha: str | None = None


@dataclass
class Hold:
    """A request held for the test: ``reached`` when it arrived, ``release()`` lets it go."""

    event: str
    when: str
    nth: int = 1  # hold the nth request of that event
    seen: int = 0
    reached: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()


def git(*args: str, cwd: Path, env: dict[str, str] | None = None, check: bool = True) -> str:
    """Run git; its stdout."""
    result = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60,
        env={**os.environ, "LC_ALL": "C", **(env or {})},
    )  # fmt: skip
    if check and result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {result.stderr}")
    return result.stdout


class FakeForge:
    """Start with ``with FakeForge(bare) as forge:``; point [forge] api_url at ``github_api``
    or ``gitlab_api``, project ``acme/fleet``."""

    def __init__(self, bare: Path, *, token: str = FORGE_TOKEN, required_approvals: int = 0):
        self.bare = bare
        self.token = token
        self.required_approvals = required_approvals
        self.pulls: dict[tuple[str, int], Pull] = {}
        self.calls: list[Call] = []
        self.holds: list[Hold] = []
        # someone else's push, landing just before one merge request is handled
        self.before_merge: list[Callable[[Pull], None]] = []
        self._lock = threading.RLock()
        self._numbers = {"github": 0, "gitlab": 0}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def github_api(self) -> str:
        return f"{self.url}/github"

    @property
    def gitlab_api(self) -> str:
        return f"{self.url}/gitlab/api/v4"

    def __enter__(self) -> FakeForge:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for hold in self.holds:
            hold.release()
        self._server.shutdown()
        self._server.server_close()

    # --- for the test ------------------------------------------------------------------------

    def hold(self, event: str, *, when: str, nth: int = 1) -> Hold:
        """Hold the ``nth`` ``event`` ("create", "merge") request from now, ``when`` "before"
        or "after" its work."""
        hold = Hold(event, when, nth)
        self.holds.append(hold)
        return hold

    def approve(self, kind: str, number: int) -> None:
        with self._lock:
            self.pulls[(kind, number)].approvals += 1

    def open_pulls(self) -> list[Pull]:
        with self._lock:
            return [p for p in self.pulls.values() if p.state == "open"]

    def of(self, method: str, suffix: str) -> list[Call]:
        """The calls of ``method`` whose path (without the query) ends with ``suffix``."""
        return [c for c in self.calls
                if c.method == method and c.path.split("?")[0].endswith(suffix)]  # fmt: skip

    # --- the API ------------------------------------------------------------------------------

    def answer(self, method: str, path: str, headers: dict[str, str], body: Any) -> tuple[int, Any]:
        parsed = urllib.parse.urlsplit(path)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        route = parsed.path
        if route.startswith("/github/"):
            if headers.get("authorization") not in (f"Bearer {self.token}", f"token {self.token}"):
                return 401, {"message": "Bad credentials",
                             "documentation_url": "https://docs.github.com/rest"}  # fmt: skip
            return self._github(method, route.removeprefix("/github"), query, body)
        if route.startswith("/gitlab/api/v4/"):
            if headers.get("private-token") != self.token and (
                headers.get("authorization") != f"Bearer {self.token}"
            ):
                return 401, {"message": "401 Unauthorized"}
            return self._gitlab(method, route.removeprefix("/gitlab/api/v4"), query, body)
        return 404, {"message": "Not Found"}

    def _github(self, method: str, route: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        base = f"/repos/{OWNER}/{REPO}/pulls"
        if not route.startswith(base):
            return 404, {"message": "Not Found"}
        rest = route[len(base) :].strip("/").split("/") if route != base else []
        if not rest and method == "POST":
            return self._create("github", body["head"], body["base"], body["title"],
                                body.get("body") or "")  # fmt: skip
        if not rest and method == "GET":
            head = query.get("head", "").partition(":")[2]
            state = query.get("state", "open")
            with self._lock:
                found = [p for p in self.pulls.values() if p.kind == "github"
                         and (not head or p.head == head) and (state == "all" or p.state == state
                         or (state == "closed" and p.state == "merged"))]  # fmt: skip
            return 200, [self._github_json(p) for p in found]
        pull = self.pulls.get(("github", int(rest[0]))) if rest and rest[0].isdigit() else None
        if pull is None:
            return 404, {"message": "Not Found"}
        if len(rest) == 1 and method == "GET":
            return 200, self._github_json(pull)
        if len(rest) == 1 and method == "PATCH":
            with self._lock:
                if body.get("state") == "closed" and pull.state == "open":
                    pull.state = "closed"
            return 200, self._github_json(pull)
        if rest[1:] == ["merge"] and method == "PUT":
            return self._merge(pull, body)
        return 404, {"message": "Not Found"}

    def _gitlab(self, method: str, route: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        base = f"/projects/{urllib.parse.quote(GITLAB_PROJECT, safe='')}/merge_requests"
        if not route.startswith(base) and not route.startswith(
            f"/projects/{GITLAB_PROJECT}/merge_requests"
        ):
            return 404, {"message": "404 Project Not Found"}
        rest = route.split("/merge_requests", 1)[1].strip("/").split("/")
        rest = [r for r in rest if r]
        if not rest and method == "POST":
            return self._create("gitlab", body["source_branch"], body["target_branch"],
                                body["title"], body.get("description") or "")  # fmt: skip
        if not rest and method == "GET":
            head, state = query.get("source_branch"), query.get("state", "all")
            wanted = {"opened": "open"}.get(state, state)
            with self._lock:
                found = [p for p in self.pulls.values() if p.kind == "gitlab"
                         and (head is None or p.head == head)
                         and (state == "all" or p.state == wanted)]  # fmt: skip
            return 200, [self._gitlab_json(p) for p in found]
        pull = self.pulls.get(("gitlab", int(rest[0]))) if rest[0].isdigit() else None
        if pull is None:
            return 404, {"message": "404 Not found"}
        if len(rest) == 1 and method == "GET":
            return 200, self._gitlab_json(pull)
        if len(rest) == 1 and method == "PUT":
            with self._lock:
                if body.get("state_event") == "close" and pull.state == "open":
                    pull.state = "closed"
            return 200, self._gitlab_json(pull)
        if rest[1:] == ["merge"] and method == "PUT":
            return self._merge(pull, body)
        return 404, {"message": "404 Not found"}

    # --- pull requests --------------------------------------------------------------------------

    def _create(self, kind: str, head: str, base: str, title: str, text: str) -> tuple[int, Any]:
        with self._lock:
            if self._sha(head) is None:
                if kind == "github":
                    return 422, {"message": "Validation Failed",
                                 "errors": [{"resource": "PullRequest", "field": "head",
                                             "code": "invalid"}]}  # fmt: skip
                return 404, {"message": "404 Branch Not Found"}
            if any(p.kind == kind and p.head == head and p.state == "open"
                   for p in self.pulls.values()):  # fmt: skip
                if kind == "github":
                    return 422, {"message": "Validation Failed", "errors": [{
                        "resource": "PullRequest", "code": "custom",
                        "message": f"A pull request already exists for {OWNER}:{head}."}]}  # fmt: skip
                return 409, {"message": ["Another open merge request already exists for this "
                                         "source branch"]}  # fmt: skip
            self._numbers[kind] += 1
            pull = Pull(kind, self._numbers[kind], head, base, title, text)
            self.pulls[(kind, pull.number)] = pull
            return 201, self._github_json(pull) if kind == "github" else self._gitlab_json(pull)

    def _merge(self, pull: Pull, body: Any) -> tuple[int, Any]:
        github = pull.kind == "github"
        with self._lock:
            if self.before_merge:
                self.before_merge.pop(0)(pull)
            if pull.state != "open":
                return 405, {"message": "Pull Request is not mergeable" if github
                             else "405 Method Not Allowed"}  # fmt: skip
            head = self._sha(pull.head)
            if body.get("sha") and body["sha"] != head:
                if github:
                    return 409, {"message": "Head branch was modified. Review and try the merge "
                                            "again."}  # fmt: skip
                return 409, {"message": f"SHA does not match HEAD of source branch: {head}"}
            if pull.approvals < self.required_approvals:
                if github:
                    return 405, {"message": "At least 1 approving review is required by "
                                            "reviewers with write access."}  # fmt: skip
                return 405, {"message": "405 Method Not Allowed"}
            squash = body.get("merge_method") == "squash" if github else bool(body.get("squash"))
            message = (
                f"{body.get('commit_title') or pull.title}\n\n{body.get('commit_message') or ''}"
                if github else body.get("squash_commit_message") or pull.title
            )  # fmt: skip
            done = self._land(pull, head or "", squash=squash, message=message)
            if done is None:
                if github:
                    return 405, {"message": "Pull Request is not mergeable"}
                return 406, {"message": "Branch cannot be merged"}
            pull.state, pull.merge_sha = "merged", done
            if not github and body.get("should_remove_source_branch"):
                git("update-ref", "-d", f"refs/heads/{pull.head}", cwd=self.bare)
        if github:
            return 200, {"sha": done, "merged": True, "message": "Pull Request successfully merged"}
        return 200, self._gitlab_json(pull)

    def _land(self, pull: Pull, head: str, *, squash: bool, message: str) -> str | None:
        """The new tip of the base branch, None when it cannot merge (conflict, not ff)."""
        base_sha = self._sha(pull.base)
        assert base_sha is not None
        forge_env = {"GIT_COMMITTER_NAME": "GitHub", "GIT_COMMITTER_EMAIL": "noreply@github.com"}
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            git("clone", "-q", "--no-tags", str(self.bare), str(work), cwd=work.parent)
            git("checkout", "-q", "-B", "landing", f"origin/{pull.base}", cwd=work)
            ancestor = subprocess.run(["git", "merge-base", "--is-ancestor", base_sha, head],
                                      cwd=work).returncode == 0  # fmt: skip
            if squash:
                merged = subprocess.run(["git", "merge", "-q", "--squash", head], cwd=work,
                                        capture_output=True, env={**os.environ, **forge_env})  # fmt: skip
                if merged.returncode != 0:
                    return None
                git("commit", "-q", "--no-verify", "-m", message, cwd=work,
                    env={**forge_env, "GIT_AUTHOR_NAME": "ruleloop",
                         "GIT_AUTHOR_EMAIL": "ruleloop@example.com"})  # fmt: skip
            elif pull.kind == "gitlab":
                if not ancestor:
                    return None  # the project merges fast-forward only
                git("merge", "-q", "--ff-only", head, cwd=work)
            else:  # GitHub's rebase: every commit re-created on the base, GitHub committing
                commits = git("rev-list", "--reverse", f"{base_sha}..{head}", cwd=work).split()
                for sha in commits:
                    picked = subprocess.run(["git", "cherry-pick", "--allow-empty", sha],
                                            cwd=work, capture_output=True,
                                            env={**os.environ, **forge_env})  # fmt: skip
                    if picked.returncode != 0:
                        subprocess.run(["git", "cherry-pick", "--abort"], cwd=work)
                        return None
            tip = git("rev-parse", "HEAD", cwd=work).strip()
            pushed = subprocess.run(["git", "push", "-q", "origin", f"HEAD:refs/heads/{pull.base}"],
                                    cwd=work, capture_output=True)  # fmt: skip
            if pushed.returncode != 0:
                return None  # the base moved while merging
            return tip

    def _sha(self, branch: str) -> str | None:
        out = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"],
                             cwd=self.bare, capture_output=True, text=True)  # fmt: skip
        return out.stdout.strip() or None

    def _github_json(self, pull: Pull) -> dict[str, Any]:
        sha = self._sha(pull.head) or pull.merge_sha or ""
        blocked = pull.approvals < self.required_approvals
        return {
            "number": pull.number,
            "html_url": f"https://github.com/{OWNER}/{REPO}/pull/{pull.number}",
            "state": "closed" if pull.state != "open" else "open",
            "merged": pull.state == "merged",
            "title": pull.title,
            "body": pull.body,
            "head": {"ref": pull.head, "sha": sha},
            "base": {"ref": pull.base},
            "mergeable": None if pull.state != "open" else True,
            "mergeable_state": "blocked" if blocked else "clean",
            "merge_commit_sha": pull.merge_sha,
        }

    def _gitlab_json(self, pull: Pull) -> dict[str, Any]:
        blocked = pull.approvals < self.required_approvals
        state = {"open": "opened"}.get(pull.state, pull.state)
        return {
            "iid": pull.number,
            "web_url": f"https://gitlab.com/{GITLAB_PROJECT}/-/merge_requests/{pull.number}",
            "state": state,
            "title": pull.title,
            "description": pull.body,
            "source_branch": pull.head,
            "target_branch": pull.base,
            "sha": self._sha(pull.head) or pull.merge_sha or "",
            "detailed_merge_status": "not_approved" if blocked else "mergeable",
            "merge_commit_sha": pull.merge_sha,
        }


def _handler(fake: FakeForge) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = {}
            headers = {k.lower(): v for k, v in self.headers.items()}
            event = _event(self.command, self.path)
            hold = None
            with fake._lock:
                for candidate in fake.holds:
                    if candidate.event == event and not candidate.reached.is_set():
                        candidate.seen += 1
                        if candidate.seen == candidate.nth:
                            hold = candidate
            if hold is not None:
                hold.reached.set()
                if hold.when == "before":
                    hold.released.wait(120)
                    self.close_connection = True
                    return  # the request is lost: its sender is gone
            status, answer = fake.answer(self.command, self.path, headers, body)
            fake.calls.append(Call(self.command, self.path, status, body, headers))
            if hold is not None:
                hold.released.wait(120)
            data = json.dumps(answer).encode()
            with contextlib.suppress(OSError):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = _serve  # noqa: N815

    return Handler


def _event(method: str, path: str) -> str | None:
    route = urllib.parse.urlsplit(path).path
    if method == "POST" and (route.endswith("/pulls") or route.endswith("/merge_requests")):
        return "create"
    if method == "PUT" and route.endswith("/merge"):
        return "merge"
    return None
