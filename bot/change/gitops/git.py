"""The `git` CLI, run as a subprocess (never through a shell), on one kept clone.

Why the CLI and not a library: it is the git the team already trusts with its deployment
repository, it speaks SSH with deploy keys and HTTPS with the credential helpers a cluster may
already have configured, and it adds no dependency to the image.

Credentials never reach argv or the clone's config: an SSH deploy key is passed through
``GIT_SSH_COMMAND``; a forge token for HTTPS goes into an ``http.extraHeader`` set through
git's ``GIT_CONFIG_*`` environment, read from its file at each command. Everything git prints
that ruleloop shows (an error's stderr) goes through ``secrets.scrub``. ``GIT_TERMINAL_PROMPT=0``:
a missing credential is an error, never a prompt that hangs the bot.

The clone lives under ``workdir`` (default: the system's temporary directory), one per process
and purpose, so replicas on one host never share one; commands on one clone run one at a
time (``locked``). Refs and paths come from validated settings and are always passed after
``--`` or as ``refs/...``, never where git would read an option.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import shlex
import shutil
import tempfile
import weakref
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from bot.change.gitops import trailers
from bot.change.gitops.errors import GitConflict, GitOpsError
from bot.change.gitops.secrets import read_secret, refuse_plain_http, scrub
from bot.kernel import GitRepoSpec
from bot.kernel.runtime import process_alive

TIMEOUT_S = 120.0
_RECORD, _FIELD = "\x1e", "\x1f"
_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Path, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)
# the user name a forge takes with a token as the HTTPS password
# What git children get of the bot's environment: the bot holds Slack, forge and database
# secrets in it. The process basics and locale, an operator's SSH agent, proxy and CA bundle,
# and git's own settings of where its config lives; GIT_DIR and the like never.
GIT_ENV = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "TZ", "LANG", "LANGUAGE",
    "SSH_AUTH_SOCK", "SSH_AGENT_PID",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
    "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "GIT_SSL_CAINFO", "GIT_SSL_CAPATH",
    "XDG_CONFIG_HOME", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM",
    "GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSH_VARIANT", "GIT_EXEC_PATH",
})  # fmt: skip

_TOKEN_USER = {"github": "x-access-token", "gitlab": "oauth2"}


@dataclass(frozen=True)
class Commit:
    """One commit as ``log`` reads it: sha, parents, subject and trailers."""

    sha: str
    parents: tuple[str, ...]
    subject: str
    trailers: dict[str, list[str]] = field(default_factory=dict)

    def trailer(self, key: str) -> str | None:
        """The first value of one trailer, None when the commit has none."""
        values = self.trailers.get(key)
        return values[0] if values else None


@dataclass(frozen=True)
class GitResult:
    """A finished git command."""

    code: int
    out: str
    err: str


def workdir_for(spec: GitRepoSpec, key: str) -> Path:
    """Where the clone for ``key`` (a target, "adr") lives in this process."""
    base = spec.workdir or Path(tempfile.gettempdir()) / f"ruleloop-git-{os.getuid()}"
    digest = hashlib.sha256(spec.repo_url.encode()).hexdigest()[:10]
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in key)
    return base / f"{safe}-{digest}-{os.getpid()}"


class GitRepo:
    """One clone of the repository of ``spec``, kept between operations."""

    def __init__(self, spec: GitRepoSpec, *, key: str, timeout_s: float = TIMEOUT_S) -> None:
        self.spec = spec
        self.url = spec.repo_url
        self.branch = spec.branch
        self.path = workdir_for(spec, key)
        self.timeout_s = timeout_s

    @property
    def remote_ref(self) -> str:
        """The target branch as fetched: refs/remotes/origin/<branch>."""
        return f"refs/remotes/origin/{self.branch}"

    @contextlib.asynccontextmanager
    async def locked(self) -> AsyncIterator[None]:
        """Hold this clone for a sequence of commands (one operation at a time per clone)."""
        locks = _LOCKS.setdefault(asyncio.get_running_loop(), {})
        lock = locks.setdefault(self.path, asyncio.Lock())
        async with lock:
            yield

    # --- the remote -----------------------------------------------------------------------------

    async def sync(self) -> str:
        """Clone (the first time) or fetch; the sha the target branch has on the remote."""
        if not await self._usable():
            await asyncio.to_thread(self._prepare_dir)
            await self.run("clone", "--no-checkout", "--no-tags", "--", self.url, str(self.path),
                           cwd=self.path.parent)  # fmt: skip
        else:
            await self.run("fetch", "--prune", "--no-tags", "origin")
        found = await self.rev(self.remote_ref)
        if found is None:
            raise GitOpsError(
                f"the repository {scrub(self.url)} has no branch {self.branch!r}: check "
                "`branch` in the settings"
            )
        return found

    async def remote_branches(self, prefix: str) -> dict[str, str]:
        """The remote's branches under ``prefix`` (e.g. ruleloop/prod-a/), name -> sha."""
        out = await self.run("ls-remote", "--heads", "origin", f"refs/heads/{prefix}*")
        branches = {}
        for line in out.splitlines():
            sha, _, ref = line.partition("\t")
            if ref.startswith("refs/heads/"):
                branches[ref.removeprefix("refs/heads/")] = sha
        return branches

    async def push(self, local: str, branch: str) -> None:
        """Push ``local`` to the remote's ``branch``, never forced; GitConflict when refused as
        not a fast-forward (someone pushed there first)."""
        result = await self.try_run("push", "--porcelain", "origin", f"{local}:refs/heads/{branch}")
        if result.code == 0:
            return
        text = f"{result.out}\n{result.err}"
        if any(s in text for s in ("[rejected]", "non-fast-forward", "fetch first", "stale info")):
            raise GitConflict(
                f"the push to {branch} was refused as not a fast-forward: someone pushed to it "
                "since ruleloop read it"
            )
        if "protected" in text or "pre-receive hook declined" in text:
            raise GitOpsError(
                f"the remote refused the push to {branch} ({self._tail(result.err)}): the "
                "branch is protected; let ruleloop open pull requests (set [forge], "
                "direct_push = false) or allow its key to push"
            )
        raise self._failed(("push",), result)

    async def delete_branch(self, branch: str) -> None:
        """Delete the remote's ``branch``; nothing to do when it is gone already."""
        result = await self.try_run("push", "--porcelain", "origin", f":refs/heads/{branch}")
        if result.code != 0 and "remote ref does not exist" not in result.err + result.out:
            raise self._failed(("push", "--delete"), result)

    # --- reading --------------------------------------------------------------------------------

    async def rev(self, ref: str) -> str | None:
        """The commit a ref or sha names, None when there is none."""
        result = await self.try_run("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        return result.out.strip() if result.code == 0 else None

    async def show(self, rev: str, path: str) -> str | None:
        """A file's text at ``rev``; None when the file does not exist there."""
        result = await self.try_run("show", f"{rev}:{path}")
        if result.code != 0:
            if "does not exist" in result.err or "exists on disk, but not in" in result.err:
                return None
            raise self._failed(("show",), result)
        return result.out

    async def blob(self, rev: str, path: str) -> str | None:
        """The blob id of a file at ``rev`` (equal ids: equal contents), None when absent."""
        return await self.rev_quiet(f"{rev}:{path}")

    async def rev_quiet(self, spec: str) -> str | None:
        result = await self.try_run("rev-parse", "--verify", "--quiet", spec)
        return result.out.strip() if result.code == 0 else None

    async def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        """Whether ``ancestor`` is in the history of ``descendant`` (or is it)."""
        result = await self.try_run("merge-base", "--is-ancestor", ancestor, descendant)
        if result.code not in (0, 1):
            raise self._failed(("merge-base",), result)
        return result.code == 0

    async def log(self, revisions: str, *, paths: Sequence[str] = ()) -> list[Commit]:
        """The commits of ``revisions`` (``a..b``), newest first, with their trailers."""
        fmt = _FIELD.join(["%H", "%P", "%s", "%(trailers:only,unfold)"]) + _RECORD
        args = ["log", f"--format={fmt}", revisions]
        if paths:
            args += ["--", *paths]
        out = await self.run(*args)
        commits = []
        for record in out.split(_RECORD):
            parts = record.strip("\n").split(_FIELD)
            if len(parts) != 4:
                continue
            sha, parents, subject, block = parts
            commits.append(
                Commit(sha=sha, parents=tuple(parents.split()), subject=subject,
                       trailers=trailers.parse(block))
            )  # fmt: skip
        return commits

    # --- writing (in the clone) -------------------------------------------------------------------

    async def start(self, branch: str, base: str) -> None:
        """A local ``branch`` at ``base`` with a clean worktree (whatever was there before)."""
        await self.try_run("revert", "--abort")  # a revert a killed process left half done
        await self.run("checkout", "--force", "-B", branch, base)
        await self.run("clean", "-fdq")

    async def write(self, path: str, text: str) -> None:
        """Write one file of the worktree and stage it; GitOpsError when ``path`` leaves it."""
        target = self._inside(path)
        await asyncio.to_thread(_write, target, text)
        await self.run("add", "--", path)

    def _inside(self, path: str) -> Path:
        """``path`` in the worktree, as written; refused when a committed symbolic link (or
        ``..``) would take the write elsewhere: outside the clone, or into its ``.git``."""
        root = self.path.resolve()
        plain = Path(os.path.normpath(root / path))
        inside = plain.is_relative_to(root) and not plain.is_relative_to(root / ".git")
        if inside and plain != root and plain.resolve() == plain:
            return plain
        raise GitOpsError(
            f"refusing to write {path}: in the repository it leads to {plain.resolve()}, not "
            "to a file of the repository (a committed symbolic link, or ..): ruleloop writes "
            "only real files inside its clone; replace the link with a directory"
        )

    async def remove(self, path: str) -> None:
        """Remove one file from the worktree and the index."""
        await self.run("rm", "--quiet", "--", path)

    async def staged(self) -> bool:
        """Whether the index differs from HEAD (something to commit)."""
        result = await self.try_run("diff", "--cached", "--quiet")
        return result.code == 1

    async def commit(self, message: str) -> str:
        """Commit what is staged with ``message``; the new commit's sha."""
        await self.run("commit", "--quiet", "--no-verify", "-F", "-", input=message)
        head = await self.rev("HEAD")
        assert head is not None
        return head

    async def revert(self, shas: Sequence[str]) -> None:
        """Stage the revert of ``shas`` (newest first) without committing; GitConflict when they
        no longer revert cleanly (someone changed the same lines since)."""
        result = await self.try_run("revert", "--no-commit", "--no-edit", *shas)
        if result.code != 0:
            await self.try_run("revert", "--abort")
            await self.try_run("reset", "--hard", "--quiet")
            if "conflict" in (result.out + result.err).lower():
                raise GitConflict(
                    "the change no longer reverts cleanly: someone changed the same lines "
                    "since ruleloop's commit"
                )
            raise self._failed(("revert",), result)

    # --- running git ----------------------------------------------------------------------------

    async def run(self, *args: str, cwd: Path | None = None, input: str | None = None) -> str:
        """stdout of one git command; GitOpsError (scrubbed) when it fails."""
        result = await self.try_run(*args, cwd=cwd, input=input)
        if result.code != 0:
            raise self._failed(args, result)
        return result.out

    async def try_run(
        self, *args: str, cwd: Path | None = None, input: str | None = None
    ) -> GitResult:
        """One git command, whatever its exit status."""
        env = self._env()
        proc = await asyncio.create_subprocess_exec(
            "git", *args,
            cwd=str(cwd or self.path),
            env=env,
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(input.encode() if input is not None else None), self.timeout_s
            )
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise GitOpsError(
                f"git {args[0]} did not finish within {self.timeout_s:g} s (is the remote "
                f"{scrub(self.url, self._secrets())} reachable?)"
            ) from None
        assert proc.returncode is not None
        return GitResult(
            proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
        )

    def _env(self) -> dict[str, str]:
        """Only what git needs of the bot's environment (never SLACK_BOT_TOKEN and the like),
        then what this repository sets."""
        env = {k: v for k, v in os.environ.items() if k in GIT_ENV or k.startswith("LC_")}
        env.update(
            GIT_TERMINAL_PROMPT="0",
            LC_ALL="C",
            GIT_AUTHOR_NAME=self.spec.author_name,
            GIT_AUTHOR_EMAIL=self.spec.author_email,
            GIT_COMMITTER_NAME=self.spec.author_name,
            GIT_COMMITTER_EMAIL=self.spec.author_email,
        )
        if self.spec.deploy_key_file is not None:
            ssh = ["ssh", "-i", str(self.spec.deploy_key_file), "-o", "IdentitiesOnly=yes",
                   "-o", "BatchMode=yes"]  # fmt: skip
            if self.spec.known_hosts_file is not None:
                ssh += ["-o", f"UserKnownHostsFile={self.spec.known_hosts_file}",
                        "-o", "StrictHostKeyChecking=yes"]  # fmt: skip
            env["GIT_SSH_COMMAND"] = shlex.join(ssh)
        header = self._auth_header()
        if header is not None:
            env.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="http.extraHeader",
                       GIT_CONFIG_VALUE_0=header)  # fmt: skip
        return env

    def _auth_header(self) -> str | None:
        """HTTPS only, with a forge token: Basic auth as the forge takes a token over git."""
        forge = self.spec.forge
        if forge is None or urlsplit(self.url).scheme not in ("http", "https"):
            return None
        refuse_plain_http(self.url, f"{forge.kind} token")
        user = _TOKEN_USER[forge.kind]
        token = read_secret(forge.token_file, f"{forge.kind} token")
        pair = base64.b64encode(f"{user}:{token}".encode()).decode()
        return f"Authorization: Basic {pair}"

    def _secrets(self) -> list[str]:
        forge = self.spec.forge
        if forge is None:
            return []
        with contextlib.suppress(GitOpsError):
            return [read_secret(forge.token_file, "token")]
        return []

    def _tail(self, text: str) -> str:
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        return scrub(" / ".join(lines[-3:]) or "no message", self._secrets())

    def _failed(self, args: Sequence[str], result: GitResult) -> GitOpsError:
        return GitOpsError(
            f"git {' '.join(args[:2])} failed (exit {result.code}): {self._tail(result.err)}"
        )

    async def _usable(self) -> bool:
        if not (self.path / ".git").is_dir():
            return False
        result = await self.try_run("rev-parse", "--git-dir")
        return result.code == 0

    def _prepare_dir(self) -> None:
        """An empty place for the clone; clones of processes that are gone are removed."""
        if self.path.exists():
            shutil.rmtree(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        stem = self.path.name.rsplit("-", 1)[0]
        for other in self.path.parent.glob(f"{stem}-*"):
            pid = other.name.rsplit("-", 1)[-1]
            if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
                shutil.rmtree(other, ignore_errors=True)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
