"""Reports cross the bot's packages as models, not dicts: the canary report is
``bot.canary.schema.CanaryReport`` and an incident's diagnosis summary is
``bot.kernel.store.summary.DiagnosisSummary``. These ratchets fail when code goes back to reading either
by key, or when the untyped ``dict[str, Any]`` count grows past today's figure (197 before the
two models; lower it when you type another one)."""

from __future__ import annotations

import re
from pathlib import Path

from bot.kernel.store.summary import CauseEntry, DiagnosisSummary

BOT = Path(__file__).resolve().parent.parent / "bot"
UNTYPED_CEILING = 181  # `dict[str, Any]` written in bot/ (197 before the two models)
SUMMARY_BY_KEY = re.compile(r"\bsummary(?:\.get\(|\[\s*[\"'])")
CANARY_BY_KEY = re.compile(
    r"\b(?:report|kept|judged|result\.report)(?:\.get\(|\[)\s*[\"']"
    r"(?:ttft_ms|tpot_ms|itl_ms|e2e_ms|gates|passed|goodput_ratio|kv_fragmentation|requests|"
    r"tokens|workload_shape|background)[\"']"
)


def _sources() -> dict[str, str]:
    return {str(p.relative_to(BOT.parent)): p.read_text() for p in sorted(BOT.rglob("*.py"))}


def _hits(pattern: re.Pattern[str], sources: dict[str, str]) -> list[str]:
    return [
        f"{path}:{n}: {line.strip()}"
        for path, text in sources.items()
        for n, line in enumerate(text.splitlines(), 1)
        if pattern.search(line)
    ]


def test_untyped_dicts_do_not_grow() -> None:
    count = sum(text.count("dict[str, Any]") for text in _sources().values())
    assert count <= UNTYPED_CEILING, (
        f"{count} `dict[str, Any]` in bot/ (ceiling {UNTYPED_CEILING}): give the new data a "
        "model (pydantic or a dataclass) instead"
    )


def test_no_module_reads_a_diagnosis_summary_by_key() -> None:
    sources = {p: t for p, t in _sources().items() if p != "bot/kernel/store/summary.py"}
    assert _hits(SUMMARY_BY_KEY, sources) == []


def test_no_module_reads_a_canary_report_by_key() -> None:
    # the ADR matcher reads a match condition's number from any JSON report by its dotted path
    # (`ruleloop adr match --report`), a canary's or the diagnosis's: by key, on purpose
    skip = ("bot/canary/schema.py", "bot/adr/metrics.py")
    sources = {p: t for p, t in _sources().items() if p not in skip}
    assert _hits(CANARY_BY_KEY, sources) == []


def test_the_ratchets_catch_a_read_by_key() -> None:
    """The judges above, on the lines they exist to refuse."""
    bad = {
        "x.py": 'rows = summary.get("headline") or {}\n'
        'ok = kept["passed"]\n'
        'p99 = report.get("ttft_ms")\n'
    }
    assert len(_hits(SUMMARY_BY_KEY, bad)) == 1
    assert len(_hits(CANARY_BY_KEY, bad)) == 2


def test_a_stored_summary_of_another_shape_keeps_what_it_can() -> None:
    """One part an earlier release wrote in another shape is dropped, never the whole summary
    (the thread and the page still show the numbers); a cause entry naming no cause is
    dropped alone."""
    stored = {
        "headline": {"ttft_p99_ms": 2400.0, "tpot_p99_ms": None},
        "baseline": {"ttft_p99_ms": "350 ms"},  # not [limit, ADR]
        "matches": ["ADR-20260831-01"],
        "causes": [{"cause": "queueing", "verdict": "supported"}, {"verdict": "x"}, "junk"],
        "from_a_newer_release": {"kept": True},
    }
    summary = DiagnosisSummary.of(stored)
    assert summary.diagnosed and summary.headline == stored["headline"]
    assert summary.baseline == {} and summary.matches == ["ADR-20260831-01"]
    assert summary.causes == [CauseEntry(cause="queueing", verdict="supported")]
    assert summary.supported() == ["queueing"]
    assert summary.json_dict()["from_a_newer_release"] == {"kept": True}
    assert DiagnosisSummary.of(None) == DiagnosisSummary() and not DiagnosisSummary().diagnosed
