"""The repository stands on its own: no file points at documents outside it.

Design notes live outside the repository while the project is built; what users and developers
need from them is written into docs/ and the code. A file that cites the outside document
(by its name, or by a path out of the checkout) sends the reader somewhere they cannot follow.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
# Spelled in pieces, so that this file does not match itself.
OUTSIDE = re.compile("|".join([r"\bDESIGN" + r"\.md\b", r"\.\./" + "shared\\b"]))


def outside_references(name: str, text: str) -> list[str]:
    """Lines of ``text`` that point outside the repository, as 'file:line: text'."""
    return [
        f"{name}:{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        if OUTSIDE.search(line)
    ]


def repository_files() -> list[str]:
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("git is needed to list the repository's files (not a git checkout here)")
    listed = subprocess.run(
        [git, "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def test_no_file_points_outside_the_repository() -> None:
    found = []
    for name in repository_files():
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary (images, fixtures)
        found += outside_references(name, text)
    assert found == [], "write what is needed into docs/ instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    ["see DESIGN" + ".md section 4", "# from ../" + "shared/notes", "[design](../../" + "shared)"],
)
def test_check_finds_a_pointer_outside(line: str) -> None:
    assert outside_references("x.md", f"ok\n{line}\n") == [f"x.md:2: {line}"]
    assert outside_references("x.md", "a design.md of our own\nshared/ folder inside\n") == []
