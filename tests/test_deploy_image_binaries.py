"""Every program the bot runs is installed in the image's final stage.

The programs are found in bot/ itself (create_subprocess_exec / subprocess / posix_spawnp /
shutil.which with a literal name, and ssh wherever GIT_SSH_COMMAND is set), so a new one fails
here until the Dockerfile installs it. Docker is not needed: the Dockerfile is read.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from tests.test_deploy_packaging import DOCKERFILE, ROOT, parse_dockerfile

# the Debian package that puts each program on PATH (python:slim is Debian)
PACKAGES = {"git": "git", "ssh": "openssh-client"}
# already in the base image
IN_BASE = {"python", "python3"}
# `ruleloop eval` starts local vLLM engines behind nginx and reads lscpu: a benchmark for a
# developer's machine or CI (`make eval`), never run by the bot in its image
NOT_IN_IMAGE = ("bot/eval/",)

CALLS = [
    re.compile(r"create_subprocess_exec\(\s*\"([^\"]+)\""),
    re.compile(r"subprocess\.(?:run|Popen|call|check_call|check_output)\(\s*\[\s*\"([^\"]+)\""),
    re.compile(r"posix_spawnp?\(\s*\"([^\"]+)\""),
    re.compile(r"shutil\.which\(\s*\"([^\"]+)\""),
]


def programs_run_by(root: Path) -> dict[str, str]:
    """Each external program named in the code under ``root``, with a file that runs it."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        if str(path.relative_to(ROOT)).startswith(NOT_IN_IMAGE):
            continue
        text = path.read_text()
        for call in CALLS:
            for name in call.findall(text):
                found.setdefault(name, str(path.relative_to(ROOT)))
        if "GIT_SSH_COMMAND" in text:  # git runs ssh for a deploy key
            found.setdefault("ssh", str(path.relative_to(ROOT)))
    return found


def apt_installed(dockerfile: str) -> tuple[set[str], list[str]]:
    """The packages the final stage installs with apt-get, and what is wrong with how."""
    final = parse_dockerfile(dockerfile)[-1]
    packages: set[str] = set()
    problems: list[str] = []
    for keyword, args in final.instructions:
        if keyword != "RUN" or "apt-get install" not in args:
            continue
        if "--no-install-recommends" not in args:
            problems.append("apt-get install without --no-install-recommends")
        if "rm -rf /var/lib/apt/lists" not in args:
            problems.append("apt lists are left in the image (rm -rf /var/lib/apt/lists/*)")
        for command in re.split(r"&&|;", args):
            words = shlex.split(command)
            if words[:2] == ["apt-get", "install"]:
                packages |= {w for w in words[2:] if not w.startswith("-")}
    return packages, problems


def missing_programs(dockerfile: str, programs: dict[str, str]) -> list[str]:
    installed, problems = apt_installed(dockerfile)
    for name, where in sorted(programs.items()):
        if name in IN_BASE:
            continue
        package = PACKAGES.get(name)
        if package is None:
            problems.append(f"{where} runs {name!r}: add its Debian package to PACKAGES here")
        elif package not in installed:
            problems.append(f"{where} runs {name!r}: the final stage does not install {package}")
    return problems


def test_the_bot_runs_git_and_ssh() -> None:
    # the search itself still finds the GitOps actuator's programs
    assert {"git", "ssh"} <= programs_run_by(ROOT / "bot").keys()


def test_the_final_stage_installs_every_program_the_bot_runs() -> None:
    assert missing_programs(DOCKERFILE.read_text(), programs_run_by(ROOT / "bot")) == []


def test_a_final_stage_without_git_fails() -> None:
    text = DOCKERFILE.read_text()
    without = re.sub(r"RUN apt-get update \\\n(.*\\\n)*.*apt/lists/\*\n", "", text)
    assert without != text
    problems = missing_programs(without, {"git": "bot/change/gitops/git.py", "ssh": "bot/change/gitops/git.py"})
    assert problems == [
        "bot/change/gitops/git.py runs 'git': the final stage does not install git",
        "bot/change/gitops/git.py runs 'ssh': the final stage does not install openssh-client",
    ]
    unknown = missing_programs(text, {"kubectl": "bot/x.py"})
    assert unknown == ["bot/x.py runs 'kubectl': add its Debian package to PACKAGES here"]


def test_an_install_that_keeps_recommends_or_lists_fails() -> None:
    text = DOCKERFILE.read_text().replace("--no-install-recommends ", "")
    text = text.replace("rm -rf /var/lib/apt/lists/*", "true")
    assert apt_installed(text)[1] == [
        "apt-get install without --no-install-recommends",
        "apt lists are left in the image (rm -rf /var/lib/apt/lists/*)",
    ]
