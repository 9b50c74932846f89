"""A team's deployment repository for the GitOps tests: a real bare repository on disk.

``Fleet.create(tmp_path)`` makes ``fleet.git`` (bare, branch main) holding
docs/examples/gitops/ (the kustomize base and prod overlay the docs show), pushed as one
commit by a person. ``commit`` makes another person's commit (what a teammate pushes while
ruleloop works); ``history`` reads main's commits with their trailers; ``branches`` the
branches there are.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "docs" / "examples" / "gitops"
OVERLAY = "apps/vllm/overlays/prod"
MAIN_FILE = f"{OVERLAY}/vllm-args.yaml"
CANARY_FILE = f"{OVERLAY}/vllm-canary-args.yaml"
ARGS_PATH = "spec.template.spec.containers[name=vllm].args"
PERSON = {"GIT_AUTHOR_NAME": "Alice", "GIT_AUTHOR_EMAIL": "alice@example.com",
          "GIT_COMMITTER_NAME": "Alice", "GIT_COMMITTER_EMAIL": "alice@example.com"}  # fmt: skip


def git(*args: str, cwd: Path, check: bool = True) -> str:
    result = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60,
        env={**os.environ, "LC_ALL": "C", **PERSON},
    )  # fmt: skip
    if check and result.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {result.stderr}")
    return result.stdout


@dataclass(frozen=True)
class Entry:
    """One commit of main: sha, parents, subject, whole message."""

    sha: str
    parents: list[str]
    subject: str
    message: str

    def trailer(self, key: str) -> list[str]:
        return [ln.split(":", 1)[1].strip() for ln in self.message.splitlines()
                if ln.startswith(f"{key}:")]  # fmt: skip


@dataclass(frozen=True)
class Fleet:
    """The bare repository and a person's clone of it."""

    bare: Path
    person: Path

    @classmethod
    def create(cls, tmp_path: Path) -> Fleet:
        bare = tmp_path / "fleet.git"
        git("init", "-q", "--bare", "-b", "main", str(bare), cwd=tmp_path)
        person = tmp_path / "alice"
        git("clone", "-q", str(bare), str(person), cwd=tmp_path)
        git("checkout", "-q", "-b", "main", cwd=person)
        for item in EXAMPLE.iterdir():
            target = person / item.name
            if item.is_dir():
                shutil.copytree(item, target)
            else:
                shutil.copy(item, target)
        git("add", "-A", cwd=person)
        git("commit", "-q", "-m", "vLLM on the fleet: base and prod overlay", cwd=person)
        git("push", "-q", "origin", "main", cwd=person)
        return cls(bare=bare, person=person)

    def head(self) -> str:
        return git("rev-parse", "refs/heads/main", cwd=self.bare).strip()

    def read(self, path: str, rev: str = "main") -> str:
        return git("show", f"{rev}:{path}", cwd=self.bare)

    def commit(self, path: str, text: str, message: str) -> str:
        """A person's commit on main (pulled first, pushed after)."""
        git("pull", "-q", "--ff-only", "origin", "main", cwd=self.person)
        (self.person / path).parent.mkdir(parents=True, exist_ok=True)
        (self.person / path).write_text(text)
        git("add", "--", path, cwd=self.person)
        git("commit", "-q", "-m", message, cwd=self.person)
        git("push", "-q", "origin", "main", cwd=self.person)
        return git("rev-parse", "HEAD", cwd=self.person).strip()

    def history(self, since: str | None = None) -> list[Entry]:
        """main's commits, newest first (since ``since``, exclusive)."""
        revisions = f"{since}..main" if since else "main"
        out = git("log", "--format=%H%x1f%P%x1f%s%x1f%B%x1e", revisions, cwd=self.bare)
        entries = []
        for record in out.split("\x1e"):
            parts = record.strip("\n").split("\x1f")
            if len(parts) == 4:
                entries.append(Entry(parts[0], parts[1].split(), parts[2], parts[3]))
        return entries

    def branches(self) -> list[str]:
        out = git("for-each-ref", "--format=%(refname:short)", "refs/heads/", cwd=self.bare)
        return sorted(out.split())

    def linear(self) -> bool:
        """No merge commits on main."""
        return all(len(e.parents) <= 1 for e in self.history())
