"""The validator on the real store and on broken copies of it, through the API and the CLI."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.adr import vllm_args
from bot.adr.validate import default_checker, validate
from bot.app.cli import cli

ADR_DIR = Path(__file__).parent.parent / "adr"
SEED_NAME = "ADR-20260831-01-kv-cache-paging-throughput.md"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A copy of the repository's accepted ADRs (no drafts) to break."""
    root = tmp_path / "adr"
    shutil.copytree(ADR_DIR, root, ignore=shutil.ignore_patterns("drafts"))
    return root


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _seed(root: Path, *replacements: tuple[str, str]) -> str:
    text = (root / SEED_NAME).read_text(encoding="utf-8")
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    return text


def _as_new_id(root: Path, adr_id: str, *replacements: tuple[str, str]) -> str:
    date = f"{adr_id[4:8]}-{adr_id[8:10]}-{adr_id[10:12]}"
    return _seed(
        root, ("ADR-20260831-01", adr_id), ("date: 2026-08-31", f"date: {date}"), *replacements
    )


def test_repository_store_is_valid() -> None:
    assert validate(ADR_DIR) == []


def test_cli_validate_passes_on_repository_store() -> None:
    result = CliRunner().invoke(cli, ["adr", "validate", str(ADR_DIR), "--no-vllm"])
    assert result.exit_code == 0, result.output
    assert "is valid" in result.output


NEW = "ADR-20261129-01"
GATES = "gates:\n  max_ttft_p99_ms: 350.0\n  max_tpot_p99_ms: 35.0\n  min_goodput_ratio: 0.95\n"
NEWLINE_VALUE = 'kv-cache-dtype: "fp8\\n--trust-remote-code"'

# (file to write, id it gets (None: the seed's own), replacements, field, why)
BROKEN = [
    ("ADR-20260831-01-copy.md", None, [], "id", "is already the id of"),
    ("x", NEW, [("supersedes: []", "supersedes: [ADR-20250101-01]")],
     "supersedes", "ADR-20250101-01 is not an ADR here"),
    ("x", NEW, [("supersedes: []", f"supersedes: {NEW}")], "supersedes", "cannot supersede itself"),
    ("x", NEW, [(GATES, "")], "gates", "an accepted ADR needs canary gates"),
    ("ADR-20261129-02-x.md", NEW, [], "id", "file name must start with the id"),
    ("x", NEW, [("date: 2026-11-29", "date: 2026-11-30")], "date", "differs from the date in"),
    ("drafts/ADR-20261129-01-x.md", NEW, [], "status", "a draft must be 'proposed'"),
    ("x", NEW, [("block-size: 32", "tensor-parallel-size: 8")],
     "fix.engine_args.tensor-parallel-size", "is not a tunable flag"),
    ("x", NEW, [("block-size: 32", "block-size: 7")], "fix.engine_args.block-size", "multiple of"),
    ("x", NEW, [("block-size: 32", NEWLINE_VALUE)], "fix.engine_args.kv-cache-dtype", "a newline"),
    ("x", NEW, [("block-size: 32", "kv-cache-dtype: fp8;reboot")],
     "fix.engine_args.kv-cache-dtype", "shell metacharacter"),
    ("x", NEW, [("supersedes: []", "supersedes: [ADR-20260831-01]")],
     "status", f"superseded by accepted {NEW}"),
    ("x", NEW, [("metric: goodput_ratio", "metric: goodput")], "match.1.metric", "unknown metric"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "adr_id", "replacements", "field", "why"),
    BROKEN,
    ids=[f"{b[3]}: {b[4]}" for b in BROKEN],
)
def test_validate_names_file_field_and_why_on_broken_copy(
    store: Path,
    name: str,
    adr_id: str | None,
    replacements: list[tuple[str, str]],
    field: str,
    why: str,
) -> None:
    text = _as_new_id(store, adr_id, *replacements) if adr_id else _seed(store, *replacements)
    _write(store / (f"{adr_id}-x.md" if name == "x" else name), text)
    problems = validate(store)
    assert any(p.field == field and why in p.why for p in problems), [str(p) for p in problems]
    # The CLI prints the same problem, names the file, and exits 2.
    result = CliRunner().invoke(cli, ["adr", "validate", str(store), "--no-vllm"])
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert any(field in line and why in line and line.startswith(str(store)) for line in lines)
    assert "problem(s) found" in result.stderr


def test_validate_single_file_checks_ids_against_its_store(store: Path) -> None:
    broken = _write(
        store / "drafts" / "ADR-20261129-01-x.md",
        _as_new_id(
            store,
            "ADR-20261129-01",
            ("status: accepted", "status: proposed"),
            ("supersedes: []", "supersedes: [ADR-20260831-02]"),
        ),
    )
    problems = validate(broken)
    assert [(p.file, p.field) for p in problems] == [(str(broken), "supersedes")]
    assert "known: ADR-20260831-01, ADR-20261129-01" in problems[0].why


def test_validate_accepts_superseded_chain(store: Path) -> None:
    _write(
        store / "ADR-20261129-01-x.md",
        _as_new_id(store, "ADR-20261129-01", ("supersedes: []", "supersedes: [ADR-20260831-01]")),
    )
    _write(store / SEED_NAME, _seed(store, ("status: accepted", "status: superseded")))
    assert validate(store) == []


def test_validate_reports_unreadable_and_empty_paths(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert [p.why for p in validate(tmp_path / "empty")] == ["no ADR-*.md files here"]
    _write(tmp_path / "ADR-20261129-01-x.md", "---\nid: [\n---\n")
    problems = validate(tmp_path / "ADR-20261129-01-x.md")
    assert problems[0].field == "front matter" and "not valid YAML" in problems[0].why


@pytest.mark.slow
@pytest.mark.skipif(not vllm_args.available(), reason="vLLM is not installed in this Python")
def test_validate_asks_vllms_own_parser_when_installed(store: Path) -> None:
    # swap-space is on the allowlist (older fleets) but vLLM 0.32 removed it: only vLLM knows.
    _write(
        store / "ADR-20261129-01-x.md",
        _as_new_id(store, "ADR-20261129-01", ("block-size: 32", "swap-space: 4")),
    )
    checker = default_checker(None)
    assert checker is not None
    problems = validate(store, checker=checker)
    assert [(p.field, p.file) for p in problems] == [
        ("fix.engine_args", str(store / "ADR-20261129-01-x.md"))
    ]
    assert f"vLLM {vllm_args.version()} refuses" in problems[0].why
    assert "unrecognized arguments: --swap-space" in problems[0].why
    assert vllm_args.refusal(["--max-num-batched-tokens", "lots"]) is not None
    assert vllm_args.refusal(["--enable-chunked-prefill", "--block-size", "32"]) is None
