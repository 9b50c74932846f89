"""The pictures in README and docs show what the code prints today.

`make pictures` (bench/doc_pictures.py) runs the demo, screenshots its Slack thread and incident
page, and writes docs/img/pictures.json: each picture's sha256, the text it shows, the incident's
numbers as the store holds them, and the sha256 of every module that renders them. These tests
fail when a picture was swapped without its record, when a renderer changed since the pictures
were made, or when a picture's numbers are not what the product prints from its own source.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from pathlib import Path

import pytest

from bot.kernel.numbers.reading import Measured
from bot.kernel.numbers.text import FOUR, show_reading

ROOT = Path(__file__).resolve().parent.parent
IMG = ROOT / "docs" / "img"
REMAKE = "the pictures are stale: remake them with `make pictures` and commit docs/img"


def _manifest() -> dict:
    path = IMG / "pictures.json"
    assert path.exists(), f"docs/img/pictures.json is missing; {REMAKE}"
    return json.loads(path.read_text())


def _doc_pictures():
    spec = importlib.util.spec_from_file_location("doc_pictures", ROOT / "bench/doc_pictures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _referenced() -> set[str]:
    """Every docs/img picture README and docs/*.md show."""
    names = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        names.update(re.findall(r"img/([\w.-]+\.png)", doc.read_text()))
    return names


def test_every_picture_shown_is_the_one_recorded() -> None:
    recorded = _manifest()["pictures"]
    shown = _referenced()
    assert shown, "README and docs show no picture from docs/img: the pattern is wrong"
    for name in sorted(shown):
        assert name in recorded, f"docs show img/{name}, which pictures.json does not record"
        digest = hashlib.sha256((IMG / name).read_bytes()).hexdigest()
        assert digest == recorded[name], f"img/{name} is not the picture recorded; {REMAKE}"


def test_the_renderers_are_the_ones_that_made_the_pictures() -> None:
    made_with = _manifest()["renderers"]
    now = _doc_pictures().renderer_digests(ROOT)
    changed = sorted(p for p in set(made_with) | set(now) if made_with.get(p) != now.get(p))
    assert not changed, f"changed since the pictures were made: {', '.join(changed)}; {REMAKE}"


@pytest.mark.parametrize("key", [key for key, *_ in FOUR])
def test_the_page_shows_each_number_as_the_product_prints_it(key: str) -> None:
    manifest = _manifest()
    summary = manifest["summary"]
    measured = Measured.from_json(summary.get("headline"), summary.get("bounds"),
                                  summary.get("spans"))  # fmt: skip
    printed = show_reading(key, measured.reading(key))
    page = manifest["texts"]["incident-page.png"]
    assert printed in page, f"the page picture does not show {key} as {printed!r}; {REMAKE}"


def test_a_stale_picture_fails(tmp_path: Path) -> None:
    """The judge above, on a renderer edited after the pictures were made."""
    module = _doc_pictures()
    for name in module.RENDERERS:
        src = ROOT / name
        dst = tmp_path / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            import shutil

            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dst.write_bytes(src.read_bytes())
    before = module.renderer_digests(tmp_path)
    (tmp_path / "bot/kernel/numbers/text.py").write_text("NOT_MEASURED = '0.0 %'\n")
    after = module.renderer_digests(tmp_path)
    assert [p for p in before if before[p] != after[p]] == ["bot/kernel/numbers/text.py"]
