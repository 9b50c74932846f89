"""Packaging: the Dockerfile and .dockerignore, the wheel, and the Slack app manifest.

Docker cannot pull images here, so each check reads the files (the Kubernetes manifests are
tests/test_deploy_kubernetes.py): each is
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

from tests.fakes.slack_api import FakeSlack

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
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif stages:
            stages[-1].instructions.append((keyword, args.strip()))
    return stages


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
    for stage in stages:
        for keyword, args in stage.instructions:
            if keyword == "RUN" and re.search(r"pip\s+install\b", args) and heavy.search(args):
                problems.append(f"RUN installs the engine extra (torch, vLLM): {args}")
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
    assert {"pyproject.toml", "bot", "latency_checker"} <= set(build)
    assert {"adr", "runbooks", "deploy"} <= set(final)
    assert ("CMD", '["serve", "--host", "0.0.0.0", "--port", "3000"]') in stages[-1].instructions
    assert ("USER", "10001:10001") in stages[-1].instructions


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("FROM python:3.11-slim AS build\n", "", "has 1 FROM"),
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
        ("bot/slack", "bot/slack/app.py"),
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


# --- Slack app manifest ------------------------------------------------------------------------

SLACK_MANIFEST = ROOT / "deploy" / "slack" / "manifest.yml"
USAGE_HINTS = {
    "/diagnose": "[target]",
    "/apply-adr": "ADR-ID [target]",
    "/adr-draft": "[incident-id]",
}
SCOPES = {
    "chat:write",
    "chat:write.public",
    "commands",
    "files:write",
    "channels:join",
    "users:read",
}


class Recorder:
    """Stands in for the AsyncApp in ``listeners.register``: records what gets registered."""

    def __init__(self) -> None:
        self.registered: list[tuple[str, object]] = []

    def __getattr__(self, kind: str) -> object:
        def listener(constraints: object = None, *args: object, **kwargs: object) -> object:
            self.registered.append((kind, constraints))
            return lambda handler: handler

        return listener

    def names(self, kind: str) -> list[object]:
        """What was registered with ``app.<kind>(...)``: command names, action ids..."""
        return [constraints for k, constraints in self.registered if k == kind]


def registered_listeners() -> Recorder:
    """Everything the bot's ``listeners.register(app)`` registers."""
    from bot.slack import listeners

    recorder = Recorder()
    listeners.register(recorder)  # type: ignore[arg-type]
    return recorder


def manifest_problems(manifest: dict, app: Recorder) -> list[str]:
    """Where the Slack manifest and the app's listeners disagree, both ways."""
    problems: list[str] = []
    declared = {c["command"]: c for c in manifest["features"].get("slash_commands", [])}
    registered = app.names("command")
    for name in sorted(set(registered) - set(declared)):
        problems.append(f"the app registers {name} but the manifest does not declare it")
    for name in sorted(set(declared) - set(registered)):
        problems.append(f"the manifest declares {name} but the app registers no listener for it")
    socket_mode = manifest["settings"].get("socket_mode_enabled", False)
    for name, command in declared.items():
        if not socket_mode and not str(command.get("url", "")).endswith("/slack/events"):
            problems.append(f"{name}: url must be the bot's /slack/events")
    interactive = [k for k, _ in app.registered if k in ("action", "view", "shortcut", "options")]
    interactivity = manifest["settings"].get("interactivity", {})
    url = interactivity.get("request_url", "")
    if interactive and not interactivity.get("is_enabled"):
        problems.append(
            f"the app listens to {', '.join(sorted(set(interactive)))}: enable interactivity"
        )
    elif interactive and not socket_mode and not str(url).endswith("/slack/events"):
        problems.append("interactivity.request_url must be the bot's /slack/events")
    missing = SCOPES - set(manifest["oauth_config"]["scopes"]["bot"])
    if missing:
        problems.append(f"missing bot scopes: {', '.join(sorted(missing))}")
    return problems


def load_manifest() -> dict:
    import yaml

    return yaml.safe_load(SLACK_MANIFEST.read_text())


def test_slack_manifest_declares_exactly_the_apps_commands() -> None:
    problems = manifest_problems(load_manifest(), registered_listeners())
    assert not problems, "\n".join(problems)


async def test_the_real_app_answers_every_declared_command(
    tmp_path: Path, slack: FakeSlack
) -> None:
    from slack_bolt.request.async_request import AsyncBoltRequest
    from slack_bolt.response import BoltResponse

    from tests.fakes.bot import harness

    bot = harness(tmp_path, slack=slack)
    try:
        assert bot.bot.slack is not None
        listeners = bot.bot.slack._async_listeners

        async def handlers(command: str) -> int:
            body = {"command": command, "text": "", "user_id": "U1", "team_id": "T0FAKE",
                    "channel_id": "C0INCIDENTS"}  # fmt: skip
            request = AsyncBoltRequest(body=body, mode="socket_mode")
            response = BoltResponse(status=200)
            return sum([await x.async_matches(req=request, resp=response) for x in listeners])

        declared = [c["command"] for c in load_manifest()["features"]["slash_commands"]]
        found = {c: await handlers(c) for c in declared}
        assert found == {c: 1 for c in declared}, f"listeners per declared command: {found}"
        assert await handlers("/not-in-the-manifest") == 0
    finally:
        await bot.close()


def test_slack_manifest_usage_hints_and_scope_comments() -> None:
    commands = load_manifest()["features"]["slash_commands"]
    assert {c["command"]: c["usage_hint"] for c in commands} == USAGE_HINTS
    text = SLACK_MANIFEST.read_text()
    for scope in SCOPES:
        (line,) = [ln for ln in text.splitlines() if ln.strip().startswith(f"- {scope} ")]
        assert "#" in line and len(line.split("#", 1)[1].strip()) > 10, f"{scope}: say why"


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda m: m["features"]["slash_commands"].pop(0), "registers /diagnose but the manifest"),
        (
            lambda m: m["features"]["slash_commands"].append(
                {"command": "/ghost", "url": "https://x/slack/events"}
            ),
            "declares /ghost but the app registers no listener",
        ),
        (lambda m: m["settings"]["interactivity"].update(is_enabled=False), "enable interactivity"),
        (lambda m: m["settings"]["interactivity"].update(request_url="https://x/"), "request_url"),
        (lambda m: m["oauth_config"]["scopes"]["bot"].remove("files:write"), "files:write"),
        (
            lambda m: m["features"]["slash_commands"][0].update(url="https://x/events"),
            "/diagnose: url",
        ),
    ],
)
def test_slack_manifest_check_finds_a_broken_copy(change: object, problem: str) -> None:
    manifest = load_manifest()
    change(manifest)  # type: ignore[operator]
    problems = manifest_problems(manifest, registered_listeners())
    assert any(problem in p for p in problems), problems
