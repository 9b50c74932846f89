"""The release a team pins: one version, a changelog, `python -m build`, the wheel on its own.

`python -m build` runs on a copy of the checkout's files (tracked, or new and not git-ignored: a
clean clone) and makes the sdist, then the wheel from the sdist, so a file the sdist leaves out
is missing from the wheel too. Its isolated build environment gets setuptools at the version
requirements.lock pins (the one the image builds its wheel with): pip's constraint, so the build
is the same wherever it runs. Like `make venv`, it needs the package index or pip's cache.

The wheel is then installed into a fresh venv (`python -m venv`: nothing of the project's
.venv) the way the image installs it (Dockerfile, build stage): requirements.lock with
--require-hashes --no-deps, the wheel with --no-deps, then `pip check`. That is the faithful
install and fast enough (about 15 s with pip's cache), so there is no shortcut. From that venv,
outside the checkout, run `ruleloop --version` and `ruleloop --help`, and the commands that read
what the package ships: the runbooks and seed ADR under bot/shipped, the ADR template, the store's
migrations.

The checks on the built files are functions returning their problems, each also run on a
deliberately broken copy (another version, no entry point, a template left out, a changelog
without the release) so that none can pass by checking nothing. The wheel the Dockerfile's build
stage makes (`pip wheel` from the Docker context) is checked by tests/test_deploy_packaging.py;
this one checks the wheel of the release, with the same list of package files.
"""

from __future__ import annotations

import email.parser
import importlib.metadata
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.version import InvalidVersion, Version

from bot.app.cli import SUMMARIES
from tests.test_deploy_lock import locked
from tests.test_deploy_packaging import context_files

ROOT = Path(__file__).parent.parent
PYPROJECT = ROOT / "pyproject.toml"
CHANGELOG = ROOT / "CHANGELOG.md"
LOCK = ROOT / "requirements.lock"
PROJECT = tomllib.loads(PYPROJECT.read_text())["project"]
VERSION: str = PROJECT["version"]
SCRIPTS: dict[str, str] = PROJECT["scripts"]


# --- the checks --------------------------------------------------------------------------------


KEEP_A_CHANGELOG_GROUPS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
RELEASE = re.compile(r"^## \[([^\]]+)\] - (\d{4}-\d{2}-\d{2})$")


def changelog_problems(text: str, version: str) -> list[str]:
    """What CHANGELOG.md gets wrong against Keep a Changelog and pyproject.toml's version."""
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    problems = []
    if not headings or headings[0] != "## [Unreleased]":
        problems.append("the first section must be '## [Unreleased]'")
    releases: list[tuple[Version, str]] = []
    for heading in headings:
        if heading == "## [Unreleased]":
            continue
        match = RELEASE.match(heading)
        if match is None:
            problems.append(f"{heading!r}: not '## [VERSION] - YYYY-MM-DD'")
            continue
        try:
            releases.append((Version(match[1]), match[2]))
        except InvalidVersion:
            problems.append(f"{heading!r}: {match[1]!r} is not a version")
    if not releases or releases[0][0] != Version(version):
        newest = str(releases[0][0]) if releases else "none"
        problems.append(
            f"pyproject.toml's version {version} is not the newest entry (newest: {newest})"
        )
    if releases != sorted(releases, reverse=True):
        problems.append("the releases are not newest first (by version and date)")
    for section in re.split(r"(?m)^## ", text)[1:]:
        title, _, body = section.partition("\n")
        if title == "[Unreleased]":
            continue
        groups = set(re.findall(r"(?m)^### (.+)$", body))
        if not groups:
            problems.append(f"## {title}: no '### Added' (or another group) under it")
        if groups - KEEP_A_CHANGELOG_GROUPS:
            problems.append(
                f"## {title}: unknown groups {sorted(groups - KEEP_A_CHANGELOG_GROUPS)}"
            )
    return problems


def wheel_problems(
    wheel: Path, *, version: str, scripts: dict[str, str], package_files: Iterable[str]
) -> list[str]:
    """What the wheel gets wrong: its name and version, its console scripts, missing files."""
    problems = []
    expected = f"ruleloop-{version}-py3-none-any.whl"
    if wheel.name != expected:
        problems.append(f"the wheel is {wheel.name}, not {expected}")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        dist_info = f"ruleloop-{version}.dist-info"
        if f"{dist_info}/METADATA" not in names:
            found = sorted(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
            return [*problems, f"no {dist_info}/METADATA (the wheel has {found})"]
        # Read as the installed package will be: by importlib.metadata (what pip and
        # `ruleloop --version` read), from the wheel's own .dist-info.
        installed = importlib.metadata.PathDistribution(zipfile.Path(archive, f"{dist_info}/"))
        if (installed.metadata["Name"], installed.version) != ("ruleloop", version):
            problems.append(
                f"METADATA says {installed.metadata['Name']} {installed.version}, "
                f"pyproject.toml ruleloop {version}"
            )
        # pyproject's SPDX license (PEP 639, setuptools>=77) and the LICENSE file it names
        if installed.metadata["License-Expression"] != "Apache-2.0":
            problems.append(f"METADATA's License-Expression is "
                            f"{installed.metadata['License-Expression']!r}, not 'Apache-2.0'")  # fmt: skip
        if f"{dist_info}/licenses/LICENSE" not in names:
            problems.append(f"no {dist_info}/licenses/LICENSE (pyproject's license-files)")
        console = {e.name: e.value for e in installed.entry_points if e.group == "console_scripts"}
        for name, target in scripts.items():
            if console.get(name) != target:
                problems.append(
                    f"entry point {name!r}: the wheel has {console.get(name)!r}, not {target!r}"
                )
            module = target.partition(":")[0].replace(".", "/")
            if not {f"{module}.py", f"{module}/__init__.py"} & names:
                problems.append(f"entry point {name!r}: {module} is not in the wheel")
        missing = sorted(set(package_files) - names)
        if missing:
            problems.append(
                f"not in the wheel (add them to package-data in pyproject.toml): {missing}"
            )
    return problems


def sdist_problems(sdist: Path, *, version: str) -> list[str]:
    """What the sdist gets wrong: its name, its PKG-INFO version, the files a build needs."""
    problems = []
    top = f"ruleloop-{version}"
    if sdist.name != f"{top}.tar.gz":
        problems.append(f"the sdist is {sdist.name}, not {top}.tar.gz")
    with tarfile.open(sdist) as archive:
        names = set(archive.getnames())
        for needed in ("PKG-INFO", "pyproject.toml", "README.md", "LICENSE"):
            if f"{top}/{needed}" not in names:
                problems.append(f"the sdist has no {top}/{needed}")
        if f"{top}/PKG-INFO" in names:
            member = archive.extractfile(f"{top}/PKG-INFO")
            assert member is not None
            info = email.parser.HeaderParser().parsestr(member.read().decode())
            if info["Version"] != version:
                problems.append(f"PKG-INFO says {info['Version']}, pyproject.toml {version}")
    return problems


def package_files() -> list[str]:
    """Every file of the two packages in the checkout (tracked, or new and not git-ignored)."""
    return context_files("bot") + context_files("latency_checker")


# --- the build ---------------------------------------------------------------------------------


@dataclass
class Release:
    wheel: Path
    sdist: Path
    log: str


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """`python -m build` on a copy of the checkout, setuptools at the lock's version."""
    base = tmp_path_factory.mktemp("release")
    source = base / "src"
    for path in context_files("."):
        if (ROOT / path).is_file():
            (source / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, source / path)
    setuptools, _ = locked(LOCK.read_text())["setuptools"]
    constraints = base / "build-constraints.txt"
    constraints.write_text(f"setuptools=={setuptools}\n")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(base / "dist"), str(source)],
        env={**clean_environment(), "PIP_CONSTRAINT": str(constraints)},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    log = built.stdout + built.stderr
    assert built.returncode == 0, log
    (wheel,) = (base / "dist").glob("*.whl")
    (sdist,) = (base / "dist").glob("*.tar.gz")
    return Release(wheel=wheel, sdist=sdist, log=log)


def clean_environment() -> dict[str, str]:
    """This process's environment less what would point Python or ruleloop elsewhere."""
    dropped = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV"}
    return {
        key: value
        for key, value in os.environ.items()
        if key not in dropped and not key.startswith("RULELOOP_")
    }


# --- the tests ---------------------------------------------------------------------------------


def test_changelog_has_the_version_pyproject_names() -> None:
    assert changelog_problems(CHANGELOG.read_text(), VERSION) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda t: t.replace(f"## [{VERSION}]", "## [0.0.9]"), f"version {VERSION} is not the newest"),
        (lambda t: t.replace("## [Unreleased]\n", ""), "must be '## [Unreleased]'"),
        (lambda t: t.replace(f"## [{VERSION}] - ", f"## [{VERSION}] "), "not '## [VERSION] - YYYY-MM-DD'"),
        (lambda t: t + "\n## [9.0.0] - 2020-01-01\n\n### Added\n\n- a\n", "not newest first"),
        (lambda t: t.replace("### Added", "### New"), "unknown groups ['New']"),
        (lambda t: re.sub(r"(?m)^### .*$", "", t), "no '### Added'"),
    ],
)  # fmt: skip
def test_changelog_check_finds_a_broken_copy(change: Callable[[str], str], problem: str) -> None:
    text = CHANGELOG.read_text()
    broken = change(text)
    assert broken != text
    problems = changelog_problems(broken, VERSION)
    assert any(problem in p for p in problems), problems


def test_build_makes_the_sdist_and_wheel_of_this_version(release: Release) -> None:
    assert f"Successfully built {release.sdist.name} and {release.wheel.name}" in release.log
    assert sdist_problems(release.sdist, version=VERSION) == []
    assert (
        wheel_problems(
            release.wheel, version=VERSION, scripts=SCRIPTS, package_files=package_files()
        )
        == []
    )


def rewrite(wheel: Path, into: Path, change: Callable[[str, bytes], bytes | None]) -> Path:
    """A copy of ``wheel`` at ``into`` with each member's bytes through ``change`` (None: left out)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(buffer, "w") as target:
        for name in source.namelist():
            data = change(name, source.read(name))
            if data is not None:
                target.writestr(name, data)
    into.write_bytes(buffer.getvalue())
    return into


@pytest.mark.parametrize(
    ("name", "change", "problem"),
    [
        (None, lambda n, b: b.replace(f"Version: {VERSION}".encode(), b"Version: 9.9.9") if n.endswith("METADATA") else b,
         f"METADATA says ruleloop 9.9.9, pyproject.toml ruleloop {VERSION}"),
        (None, lambda n, b: None if n.endswith("entry_points.txt") else b,
         "entry point 'ruleloop': the wheel has None"),
        (None, lambda n, b: b.replace(b"bot.app.cli:main", b"bot.app.cli:cli") if n.endswith("entry_points.txt") else b,
         "the wheel has 'bot.app.cli:cli', not 'bot.app.cli:main'"),
        (None, lambda n, b: None if n == "bot/app/cli/__init__.py" else b,
         "bot/app/cli is not in the wheel"),
        (None, lambda n, b: None if n == "bot/templates/adr.md.j2" else b,
         "not in the wheel (add them to package-data in pyproject.toml): ['bot/templates/adr.md.j2']"),
        (None, lambda n, b: None if n.startswith("bot/shipped/runbooks/") else b,
         "'bot/shipped/runbooks/default.yaml'"),
        (None, lambda n, b: b.replace(b"License-Expression: Apache-2.0", b"License: Apache-2.0") if n.endswith("METADATA") else b,
         "METADATA's License-Expression is None, not 'Apache-2.0'"),
        (None, lambda n, b: None if n.endswith(".dist-info/licenses/LICENSE") else b,
         "licenses/LICENSE (pyproject's license-files)"),
        ("ruleloop-0.0.1-py3-none-any.whl", lambda n, b: b, "not ruleloop-"),
    ],
)  # fmt: skip
def test_wheel_check_finds_a_broken_copy(
    release: Release,
    tmp_path: Path,
    name: str | None,
    change: Callable[[str, bytes], bytes | None],
    problem: str,
) -> None:
    broken = rewrite(release.wheel, tmp_path / (name or release.wheel.name), change)
    problems = wheel_problems(
        broken, version=VERSION, scripts=SCRIPTS, package_files=package_files()
    )
    assert any(problem in p for p in problems), problems


def test_sdist_check_finds_another_version(release: Release, tmp_path: Path) -> None:
    broken = tmp_path / release.sdist.name
    with tarfile.open(release.sdist) as source, tarfile.open(broken, "w:gz") as target:
        for member in source.getmembers():
            data = source.extractfile(member) if member.isfile() else None
            if member.name == f"ruleloop-{VERSION}/PKG-INFO" and data is not None:
                text = data.read().replace(f"Version: {VERSION}".encode(), b"Version: 9.9.9")
                member.size, data = len(text), io.BytesIO(text)
            target.addfile(member, data)
    problems = sdist_problems(broken, version=VERSION)
    assert f"PKG-INFO says 9.9.9, pyproject.toml {VERSION}" in problems, problems
    assert any("the sdist has no" in p for p in sdist_problems(broken, version="9.9.9"))


@pytest.mark.slow
def test_the_wheel_runs_alone_in_a_fresh_venv(release: Release, tmp_path: Path) -> None:
    """Installed as the image installs it, it answers --version and --help and reads its data."""
    env = {**clean_environment(), "XDG_STATE_HOME": str(tmp_path / "state")}
    work = tmp_path / "work"  # outside the checkout: nothing of it is importable from here
    work.mkdir()

    def run(*argv: object, **extra: str) -> str:
        done = subprocess.run(
            [str(a) for a in argv], cwd=work, env={**env, **extra},
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, f"{argv}:\n{done.stdout}{done.stderr}"
        return done.stdout

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    python, ruleloop = venv / "bin" / "python", venv / "bin" / "ruleloop"
    run(python, "-m", "pip", "install", "-q", "--require-hashes", "--no-deps", "-r", LOCK)
    run(python, "-m", "pip", "install", "-q", "--no-deps", release.wheel)
    run(python, "-m", "pip", "check")

    assert run(ruleloop, "--version").strip() == f"ruleloop, version {VERSION}"
    help_text = run(ruleloop, "--help")
    listed = set(re.findall(r"(?m)^  (\S+)  ", help_text.partition("Commands:")[2]))
    assert listed == set(SUMMARIES), help_text

    package = Path(run(python, "-c", "import bot; print(bot.__file__)").strip()).parent
    assert package.is_relative_to(venv), package  # the installed copy, not the checkout's
    shipped = package / "shipped"
    runbooks = len(list((ROOT / "bot" / "shipped" / "runbooks").glob("*.yaml")))
    assert f"ok: {runbooks} runbook file(s)" in run(
        ruleloop, "runbooks", "validate", shipped / "runbooks"
    )
    assert "is valid" in run(ruleloop, "adr", "validate", shipped / "adr")
    draft = work / run(ruleloop, "adr", "new", "--title", "Release check").splitlines()[0]
    assert draft.read_text().startswith("---\nid: ADR-"), draft  # the ADR template (package data)
    store = tmp_path / "store.db"
    assert "upgraded" in run(ruleloop, "db", "upgrade", RULELOOP_DATABASE_URL=f"sqlite:///{store}")
