"""Packaging: the Dockerfile and .dockerignore, its pinned base image, and the wheel.

Docker cannot pull images here, so each check reads the files (the Kubernetes manifests are
tests/test_deploy_kubernetes.py, the Slack app manifests tests/test_deploy_slack_manifest.py,
the lock file tests/test_deploy_lock.py): each is
a function returning its problems, run on the shipped files (no problems) and on a deliberately
broken copy (the problem it must find), so that none of them can pass by checking nothing.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


# --- Dockerfile --------------------------------------------------------------------------------


@dataclass
class Stage:
    """One FROM ... stage: its name and its instructions as (INSTRUCTION, arguments)."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse_dockerfile(text: str) -> list[Stage]:
    """The stages of a Dockerfile (continuation lines joined, comments dropped)."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[Stage] = []
    defaults: dict[str, str] = {}  # ARGs before the first FROM: what FROM lines may use
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "ARG" and not stages:
            name, _, default = args.strip().partition("=")
            defaults[name] = default
        elif keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            base = re.sub(
                r"\$\{(\w+)\}|\$(\w+)", lambda m: defaults.get(m[1] or m[2], ""), words[0]
            )
            stages.append(Stage(base=base, name=name))
        elif stages:
            stages[-1].instructions.append((keyword, args.strip()))
    return stages


DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def copy_sources(stage: Stage) -> list[str]:
    """The build-context paths a stage's COPY/ADD instructions read (not --from=<stage>)."""
    sources: list[str] = []
    for keyword, args in stage.instructions:
        if keyword not in ("COPY", "ADD"):
            continue
        words = json.loads(args) if args.startswith("[") else shlex.split(args)
        flags = [w for w in words if w.startswith("--")]
        if any(f.startswith("--from=") for f in flags):
            continue
        paths = [w for w in words if not w.startswith("--")]
        sources += paths[:-1]
    return sources


def dockerfile_problems(text: str) -> list[str]:
    """What is wrong with the Dockerfile against the packaging rules."""
    stages = parse_dockerfile(text)
    problems: list[str] = []
    if len(stages) < 2:
        problems.append(f"needs a build stage and a final stage, has {len(stages)} FROM")
    if not stages:
        return problems
    final = stages[-1]
    users = [args for keyword, args in final.instructions if keyword == "USER"]
    user = users[-1].split(":")[0] if users else "root"
    if user in ("root", "0"):
        problems.append(f"the final stage runs as {user!r}; it must set a non-root USER")
    checks = [args for keyword, args in final.instructions if keyword == "HEALTHCHECK"]
    if not checks or checks[-1].upper().startswith("NONE"):
        problems.append("the final stage has no HEALTHCHECK")
    elif "127.0.0.1:3000/healthz" not in checks[-1]:
        problems.append("the HEALTHCHECK does not ask http://127.0.0.1:3000/healthz")
    entry = [args for keyword, args in final.instructions if keyword == "ENTRYPOINT"]
    if not entry or json.loads(entry[-1]) != ["ruleloop"]:
        problems.append('the final stage needs ENTRYPOINT ["ruleloop"]')
    heavy = re.compile(r"\[[^\]]*\bengine\b|\b(vllm|torch)\b")
    names = {stage.name for stage in stages if stage.name}
    for stage in stages:
        if stage.base not in names and not DIGEST.search(stage.base):
            problems.append(
                f"FROM {stage.base or '(empty)'}: the base image is not pinned by digest"
            )
        for keyword, args in stage.instructions:
            if keyword != "RUN":
                continue
            for install in re.split(r"&&|;", args):
                if not re.search(r"pip\s+install\b", install):
                    continue
                if heavy.search(install):
                    problems.append(
                        f"RUN installs the engine extra (torch, vLLM): {install.strip()}"
                    )
                if "--require-hashes" not in install and "--no-deps" not in install:
                    problems.append(
                        f"RUN pip install resolves unpinned dependencies: {install.strip()}"
                    )
    build = [args for stage in stages[:-1] for keyword, args in stage.instructions]
    if not any(re.search(r"--require-hashes.*-r\s+requirements\.lock", a) for a in build):
        problems.append("the build stage does not install requirements.lock with --require-hashes")
    for source in (s for stage in stages for s in copy_sources(stage)):
        if not (ROOT / source).exists():
            problems.append(f"COPY {source}: no such path in the repository")
    return problems


def ignore_pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex over context-relative paths (Go's Match plus **)."""
    out = ""
    i = 0
    pattern = pattern.strip("/")
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + "$")


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves ``path`` out of the context: it or a parent matches, last rule wins."""
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = ignore_pattern(pattern.removeprefix("!"))
        if any(regex.match(candidate) for candidate in candidates):
            excluded = not negate
    return excluded


def dockerignore_patterns(text: str) -> list[str]:
    """The patterns of a .dockerignore file, comments and blank lines dropped."""
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def context_files(source: str) -> list[str]:
    """The repository files under a COPY source: tracked, or new and not git-ignored."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("git is needed to list the files a COPY takes (not a git checkout here)")
    listed = subprocess.run(
        [git, "ls-files", "--cached", "--others", "--exclude-standard", "--", source],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [path for path in listed if (ROOT / path).exists()]


def dockerignore_problems(dockerfile: str, dockerignore: str) -> list[str]:
    """Files a COPY needs that .dockerignore leaves out of the build context."""
    patterns = dockerignore_patterns(dockerignore)
    problems = []
    for source in (s for stage in parse_dockerfile(dockerfile) for s in copy_sources(stage)):
        for path in context_files(source) or [source]:
            if ignored(path, patterns):
                problems.append(f"COPY {source} needs {path}, which .dockerignore excludes")
    return problems


def test_dockerfile_follows_the_packaging_rules() -> None:
    assert dockerfile_problems(DOCKERFILE.read_text()) == []


def test_dockerfile_copies_the_package_and_what_the_bot_reads() -> None:
    stages = parse_dockerfile(DOCKERFILE.read_text())
    build, final = copy_sources(stages[0]), copy_sources(stages[-1])
    assert {"pyproject.toml", "requirements.lock", "bot", "latency_checker"} <= set(build)
    assert {stage.base for stage in stages} == {
        "python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b"
    }  # both stages on the one pinned base
    assert {"adr", "runbooks", "deploy"} <= set(final)
    assert ("CMD", '["serve", "--host", "0.0.0.0", "--port", "3000"]') in stages[-1].instructions
    assert ("USER", "10001:10001") in stages[-1].instructions


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("FROM ${PYTHON_IMAGE} AS build\n", "", "has 1 FROM"),
        ("@sha256:a36c24f9", ":latest@a36c24f9", "not pinned by digest"),
        ("FROM ${PYTHON_IMAGE}\n", "FROM python:3.11-slim\n", "FROM python:3.11-slim: the base"),
        (
            "--require-hashes --no-deps -r requirements.lock",
            "-r requirements.lock",
            "resolves unpinned",
        ),
        (
            "--require-hashes --no-deps -r requirements.lock",
            "--require-hashes --no-deps .",
            "does not install requirements.lock",
        ),
        ("pip install --no-deps /wheels", "pip install /wheels", "resolves unpinned"),
        ("USER 10001:10001", "USER root", "runs as 'root'"),
        ("USER 10001:10001", "USER 0", "runs as '0'"),
        ("USER 10001:10001", "", "runs as 'root'"),
        ("HEALTHCHECK", "# HEALTHCHECK", "no HEALTHCHECK"),
        ("127.0.0.1:3000/healthz", "127.0.0.1:3000/", "does not ask"),
        ("ruleloop-*.whl", "'ruleloop-*.whl[engine]'", "engine extra"),
        ("COPY runbooks ./runbooks", "COPY playbooks ./runbooks", "COPY playbooks: no such path"),
        ('ENTRYPOINT ["ruleloop"]', 'ENTRYPOINT ["sh"]', "ENTRYPOINT"),
    ],
)
def test_dockerfile_check_finds_a_broken_copy(old: str, new: str, problem: str) -> None:
    text = DOCKERFILE.read_text()
    assert old in text
    problems = dockerfile_problems(text.replace(old, new, 1))
    assert any(problem in p for p in problems), problems


def test_dockerignore_keeps_everything_a_copy_needs() -> None:
    assert dockerignore_problems(DOCKERFILE.read_text(), DOCKERIGNORE.read_text()) == []
    patterns = dockerignore_patterns(DOCKERIGNORE.read_text())
    for path in (
        ".venv",
        ".git/config",
        "tests/test_bot_cli.py",
        "bench/x.py",
        "bot/__pycache__/a.pyc",
    ):
        assert ignored(path, patterns), path


@pytest.mark.parametrize(
    ("extra", "needed"),
    [
        ("runbooks", "runbooks/default.yaml"),
        ("**/*.yaml", "runbooks/default.yaml"),
        ("bot/surfaces/slack", "bot/surfaces/slack/app.py"),
        ("*.md", "README.md"),
    ],
)
def test_dockerignore_check_finds_an_excluded_source(extra: str, needed: str) -> None:
    problems = dockerignore_problems(DOCKERFILE.read_text(), DOCKERIGNORE.read_text() + extra)
    assert any(p.endswith(f"needs {needed}, which .dockerignore excludes") for p in problems)


def test_dockerignore_negation_brings_a_path_back() -> None:
    assert not ignored("docs/deploy.md", ["docs", "!docs/deploy.md"])
    assert ignored("docs/adr.md", ["docs", "!docs/deploy.md"])


def test_build_stage_makes_a_wheel_with_every_package_file(tmp_path: Path) -> None:
    """What the build stage does, here: copy its COPY sources (less .dockerignore), build."""
    import sys
    import zipfile

    pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools")
    stages = parse_dockerfile(DOCKERFILE.read_text())
    patterns = dockerignore_patterns(DOCKERIGNORE.read_text())
    context = tmp_path / "src"
    for source in copy_sources(stages[0]):
        for path in context_files(source):
            if not ignored(path, patterns):
                (context / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / path, context / path)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "--wheel-dir", str(tmp_path / "wheels"), str(context)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "wheels").glob("ruleloop-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = [
        p
        for p in context_files("bot") + context_files("latency_checker")
        if not ignored(p, patterns)
    ]
    missing = [p for p in shipped if p not in names]
    assert not missing, f"not in the wheel (add them to package-data in pyproject.toml): {missing}"
    assert "bot/templates/adr.md.j2" in names
    # pyproject's license-files: the build stage copies LICENSE (setuptools will refuse without)
    assert [n for n in names if n.endswith(".dist-info/licenses/LICENSE")], sorted(names)[-8:]
