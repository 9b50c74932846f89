"""An ADR records the workload shape its matrix was measured under (front matter `workload:`):
optional, validated field by field like the rest of the front matter, said in one line of the
Context section, and the same shape after parse -> render -> parse."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.adr.models import Adr
from bot.adr.parse import parse, parse_with_problems
from bot.adr.render import render
from bot.adr.validate import validate
from bot.adr.workload.describe import context_line
from bot.adr.workload.shape import Prefix, PrefixGroup, WorkloadShape
from bot.adr.workload.shape import parse as parse_shape
from bot.app.cli import cli
from bot.kernel.errors import AdrError
from tests.workload_pages import chat, long_system_prompt, shape

ROOT = Path(__file__).parent.parent
SEED_NAME = "ADR-20260831-01-kv-cache-paging-throughput.md"
SEED = ROOT / "adr" / SEED_NAME
GUIDE = ROOT / "docs" / "writing-adrs.md"
CONTEXT = "## 1. 变更上下文 (Context)"
MATRIX = "## 2. 实验对比数据 (Metrics Matrix)"

# A shape as a person writes it in the front matter: numbers as edges, quantiles left out (they
# are derived from the buckets), an unquoted YAML time.
WRITTEN = """workload:
  version: 1
  source: file
  captured_at: 2026-12-01T09:00:00Z
  prompt_tokens:
    count: 1000
    buckets: {1000: 0.0, 2000: 0.6, 5000: 0.4}
  output_tokens:
    count: 1000
    buckets: {50: 0.0, 100: 0.7, 200: 0.3}
  arrivals:
    request_rate: 6.0
"""


def _seed() -> Adr:
    return parse(SEED.read_text(encoding="utf-8"))


def _with_shape(shape: WorkloadShape) -> Adr:
    return _seed().model_copy(update={"workload": shape})


def _section(text: str) -> str:
    """The Context section of a rendered ADR."""
    return text.split(CONTEXT, 1)[1].split(MATRIX, 1)[0]


def _written(front: str = WRITTEN) -> str:
    """The seed's file with ``front`` added at the end of its front matter."""
    text = SEED.read_text(encoding="utf-8")
    head, body = text.split("\n---\n", 1)
    return f"{head}\n{front}---\n{body}"


def _groups() -> WorkloadShape:
    agents = long_system_prompt().model_dump()
    agents["prefix"] = Prefix(hit_rate=0.62, groups=(PrefixGroup(share=0.8, length=1536),))
    return WorkloadShape.model_validate(agents)


# --- optional: old ADRs stay valid and render unchanged -------------------------------------
def test_an_adr_without_a_workload_renders_byte_for_byte_as_before() -> None:
    text = SEED.read_text(encoding="utf-8")
    adr = parse(text)
    assert adr.workload is None
    assert render(adr) == text
    assert "workload" not in render(adr) and "Measured at" not in render(adr)


# --- round trip -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "measured",
    [chat(), long_system_prompt(), _groups(), shape([1] * 20, [20_000] * 20, hit_rate=None)],
    ids=["chat", "long system prompt", "prefix groups", "bounds, no hit rate"],
)
def test_parse_render_parse_gives_the_same_shape(measured: WorkloadShape) -> None:
    adr = _with_shape(measured)
    text = render(adr)
    again = parse(text)
    assert again.workload == measured
    assert again == adr  # the Context line is rendered from the shape, not kept as context
    assert render(again) == text


def test_the_front_matter_holds_the_shape_as_a_shape_file_writes_it() -> None:
    measured = chat()
    text = render(_with_shape(measured))
    front = text.split("\n---\n", 1)[0] + "\n"
    block = front.split("\nworkload:\n", 1)[1]
    # every field, nulls included: the block, unindented, is a shape file
    assert "  version: 1\n" in block and "    burstiness: null\n" in block
    unindented = "\n".join(line.removeprefix("  ") for line in block.splitlines())
    assert parse_shape(unindented, kind="yaml") == measured


def test_the_context_section_ends_with_the_line_and_has_it_once() -> None:
    measured = _groups()
    text = render(_with_shape(measured))
    line = context_line(measured)
    assert line == (
        "Measured at prompt p50 2,000–5,000 / p99 2,000–5,000 tokens, output p50 200–500 tokens, "
        "80.0 % sharing a 1,536-token prefix, 4 req/s, 8 concurrent."
    )
    section = _section(text)
    assert section.count(line) == 1 and section.rstrip().endswith(line)
    assert _seed().context in section  # the written context stays above it
    assert text.count(line) == 1


def test_a_changed_shape_says_its_own_line_and_the_old_one_is_kept_as_written() -> None:
    """The line follows the front matter; a line that no longer matches is a person's text."""
    text = render(_with_shape(chat()))
    edited = text.replace("request_rate: 4.0", "request_rate: 40.0", 1)
    adr = parse(edited)
    assert adr.workload is not None and adr.workload.arrivals.request_rate == 40.0
    assert context_line(chat()) in adr.context  # no longer rendered from the shape
    assert "40 req/s, 8 concurrent." in _section(render(adr))


def test_a_written_shape_derives_its_quantiles_and_says_them(tmp_path: Path) -> None:
    adr = parse(_written())
    assert adr.workload is not None
    prompt = adr.workload.prompt_tokens
    assert (prompt.p50, prompt.p99, prompt.bounds) == (1833.3, 4925.0, {})
    assert adr.workload.captured_at.isoformat() == "2026-12-01T09:00:00+00:00"
    assert context_line(adr.workload) == (
        "Measured at prompt p50 1,000–2,000 / p99 2,000–5,000 tokens, output p50 50–100 tokens, "
        "6 req/s."
    )
    store = tmp_path / "adr"
    store.mkdir()
    (store / SEED_NAME).write_text(_written(), encoding="utf-8")
    assert [str(p) for p in validate(store)] == []


# --- bad input: the field path and why ------------------------------------------------------
BROKEN = [
    ("buckets: {1000: 0.0, 2000: 0.6, 5000: 0.4}", "buckets: {1000: 0.0, 2000: 0.6, 5000: 0.1}",
     "workload.prompt_tokens.buckets", "the shares add up to 0.7, not 1"),
    ("    count: 1000\n    buckets: {50", "    count: 1000\n    median: 75\n    buckets: {50",
     "workload.output_tokens.median",
     "unknown field; allowed here: count, mean, p50, p90, p99, bounds, buckets"),
    ("  arrivals:\n", "  prefix:\n    groups: [{share: 0.5, length: 64, name: sys}]\n  arrivals:\n",
     "workload.prefix.groups.0.name", "unknown field; allowed here: share, length"),
    ("  version: 1", "  version: 2", "workload.version",
     "version 2: this ruleloop reads shape version 1"),
    ("captured_at: 2026-12-01T09:00:00Z", "captured_at: 2026-12-01T09:00:00", "workload.captured_at",
     "timezone info (write e.g. 2026-09-01T12:00:00Z)"),
    ("request_rate: 6.0", "request_rate: 0", "workload.arrivals.request_rate", "greater than 0"),
    ("  arrivals:\n    request_rate: 6.0\n", "", "workload.arrivals", "required field is missing"),
    ("    count: 1000\n    buckets: {1000", "    count: 1000\n    p50: 900\n    buckets: {1000",
     "workload.prompt_tokens", "p50 is 900 but the buckets give 1833.3"),
    (WRITTEN, "workload: prod.yaml\n", "workload", "write the shape inline"),
]  # fmt: skip


@pytest.mark.parametrize(("old", "new", "field", "why"), BROKEN, ids=[b[2] for b in BROKEN])
def test_a_bad_workload_block_names_its_field(old: str, new: str, field: str, why: str) -> None:
    assert old in WRITTEN
    adr, problems = parse_with_problems(_written(WRITTEN.replace(old, new)), file="x.md")
    assert adr is None
    assert any(p.field == field and why in p.why for p in problems), [str(p) for p in problems]
    with pytest.raises(AdrError, match=re.escape(why)):
        parse(_written(WRITTEN.replace(old, new)))


def test_cli_validate_reports_the_workload_field_and_exits_2(tmp_path: Path) -> None:
    store = tmp_path / "adr"
    shutil.copytree(ROOT / "adr", store, ignore=shutil.ignore_patterns("drafts"))
    broken = _written(WRITTEN.replace("request_rate: 6.0", "request_rate: -1"))
    (store / SEED_NAME).write_text(broken, encoding="utf-8")
    result = CliRunner().invoke(cli, ["adr", "validate", str(store), "--no-vllm"])
    assert result.exit_code == 2, result.output
    assert f"{store / SEED_NAME}: workload.arrivals.request_rate: " in result.stderr
    (store / SEED_NAME).write_text(_written(), encoding="utf-8")
    result = CliRunner().invoke(cli, ["adr", "validate", str(store), "--no-vllm"])
    assert result.exit_code == 0, result.output


# --- the guide ------------------------------------------------------------------------------
def test_the_guides_workload_example_is_valid_and_says_the_line_it_renders() -> None:
    guide = GUIDE.read_text(encoding="utf-8")
    (block,) = [
        b
        for b in re.findall(r"^```yaml\n(.*?)^```$", guide, flags=re.M | re.S)
        if b.startswith("workload:")
    ]
    adr = parse(_written(block))
    assert adr.workload is not None
    assert context_line(adr.workload) in " ".join(guide.split())  # as the guide wraps it
