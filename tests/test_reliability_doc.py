"""docs/reliability.md names, for each fault, the test that shows it: every one must exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.faults

ROOT = Path(__file__).parent.parent
DOC = ROOT / "docs" / "reliability.md"
NAMED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def test_every_test_the_reliability_table_names_exists() -> None:
    named = NAMED.findall(DOC.read_text())
    assert len(named) >= 16
    missing = [
        f"{file}::{name}"
        for file, name in named
        if not re.search(rf"^(async )?def {name}\(", (ROOT / file).read_text(), re.M)
    ]
    assert not missing, f"docs/reliability.md names tests that do not exist: {missing}"


def test_every_row_names_a_test() -> None:
    rows = [ln for ln in DOC.read_text().splitlines() if re.match(r"^\| \d+ \|", ln)]
    assert rows and all(NAMED.search(row) for row in rows)
