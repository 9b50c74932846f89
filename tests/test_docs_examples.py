"""The guides' examples load with the project's own loaders, so the guides cannot drift."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from bot.adr.flags import TUNABLE
from bot.adr.parse import parse
from bot.adr.validate import collect, validate_paths
from bot.diagnosis.runbooks.builtin import default_registry
from bot.diagnosis.runbooks.loader import load_dir, load_file
from bot.kernel.errors import UsageError

ROOT = Path(__file__).parent.parent
RUNBOOK_GUIDE = ROOT / "docs" / "writing-runbooks.md"
ADR_GUIDE = ROOT / "docs" / "writing-adrs.md"


def fenced(doc: Path, lang: str) -> list[str]:
    """The fenced code blocks of a Markdown file written as ```<lang>."""
    return re.findall(rf"^```{lang}\n(.*?)^```$", doc.read_text(), flags=re.M | re.S)


def example_runbook() -> str:
    (block,) = [b for b in fenced(RUNBOOK_GUIDE, "yaml") if "\nprobes:" in b]
    return block


def example_adr() -> str:
    (block,) = [b for b in fenced(ADR_GUIDE, "markdown") if b.startswith("---\n")]
    return block


def test_runbook_guide_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "kv-pressure.yaml"
    path.write_text(example_runbook())
    loaded = load_file(path, default_registry())
    assert loaded.name == "kv-pressure"
    assert [step.probe for step in loaded.runbook.probes] == [
        "vllm_metrics",
        "queue_cancel",
        "nvml",
        "prometheus",
    ]


def test_runbook_guide_example_wins_for_its_target_only(tmp_path: Path) -> None:
    runbooks = tmp_path / "runbooks"
    shutil.copytree(ROOT / "runbooks", runbooks)
    (runbooks / "kv-pressure.yaml").write_text(example_runbook())
    chosen = load_dir(runbooks, default_registry())
    alert = {"alertname": "VLLMKVCacheUsageHigh"}
    assert chosen.select({**alert, "ruleloop_target": "prod-a"}).name == "kv-pressure"  # type: ignore[union-attr]
    assert chosen.select({**alert, "ruleloop_target": "prod-b"}).name == "vllm-latency"  # type: ignore[union-attr]
    assert chosen.select({"requested_by": "U1"}).name == "default"  # type: ignore[union-attr]


def test_runbook_check_refuses_a_broken_example(tmp_path: Path) -> None:
    path = tmp_path / "kv-pressure.yaml"
    path.write_text(
        example_runbook().replace("vllm_metrics.kv_cache_usage", "vllm_metrics.kv_usage")
    )
    with pytest.raises(
        UsageError, match=r"findings\[0\]: no probe of this runbook yields vllm_metrics.kv_usage"
    ):
        load_file(path, default_registry())


def test_runbook_guide_names_every_probe_and_reading() -> None:
    registry = default_registry()
    doc = RUNBOOK_GUIDE.read_text()
    for name in registry.names():
        probe = registry.get(name)
        assert f"`{name}`" in doc, name
        params = probe.params_model.model_validate(
            {"queries": {"q": "up"}} if name == "prometheus" else {}
        )
        for reading in probe.readings(params):
            assert f"`{reading}`" in doc or name == "prometheus", f"{name}.{reading}"


def test_adr_guide_example_validates(tmp_path: Path) -> None:
    adr = parse(example_adr())
    assert adr.status == "accepted" and adr.gates is not None
    path = tmp_path / "adr" / f"{adr.id}-prefix-caching-for-agent-prompts.md"
    assert f"adr/{path.name}" in ADR_GUIDE.read_text()
    path.parent.mkdir()
    path.write_text(example_adr())
    assert validate_paths([path], context=collect(ROOT / "adr"), checker=None) == []


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("enable-prefix-caching: true", "enable-prefix-cache: true", "is not a tunable flag"),
        ("gates:\n  max_ttft_p99_ms", "gate:\n  max_ttft_p99_ms", "unknown field"),
        ("max-num-batched-tokens: 4096", "max-num-batched-tokens: 4", "out of range"),
    ],
)
def test_adr_validator_refuses_a_broken_example(
    tmp_path: Path, old: str, new: str, problem: str
) -> None:
    text = example_adr()
    assert old in text
    path = tmp_path / "ADR-20261201-01-prefix-caching-for-agent-prompts.md"
    path.write_text(text.replace(old, new))
    problems = validate_paths([path], checker=None)
    assert any(problem in p.why for p in problems), problems


def test_adr_guide_lists_every_tunable_flag() -> None:
    doc = ADR_GUIDE.read_text()
    for name in TUNABLE:
        assert f"`{name}`" in doc, name


def test_deploy_guide_names_real_files_and_the_secret_keys() -> None:
    import yaml

    doc = (ROOT / "docs" / "deploy.md").read_text()
    paths = set(re.findall(r"`((?:deploy|docs)/[\w./-]+|Dockerfile)`", doc))
    assert "deploy/slack/manifest.yml" in paths
    for path in paths:
        assert (ROOT / path).exists(), path
    secret = yaml.safe_load((ROOT / "deploy/kubernetes/base/secret.example.yaml").read_text())
    keys = re.findall(r"--from-literal=(\w+)=", doc)
    assert sorted(keys) == sorted(secret["stringData"])
