"""The thread leads with the verdict: the root message's likely-cause line, the findings message's
causes (supported with evidence, ruled out with numbers, cannot tell, data gaps) before the
findings, the console's same lines, the summary's ``causes`` JSON; and `ruleloop runbooks
validate` / the loader refusing a wrong hypothesis file with its line and what to write."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.app.cli import cli
from bot.diagnosis.causes import CauseVerdict
from bot.diagnosis.models import Baseline, Diagnosis
from bot.diagnosis.probes.types import Finding, Severity
from bot.diagnosis.runbooks.builtin import default_registry
from bot.diagnosis.runbooks.loader import inspect_file, load_dir
from bot.kernel.chat.messages import IncidentView
from bot.kernel.errors import UsageError
from bot.kernel.numbers import Measured
from bot.surfaces.slack.console import ConsoleNotifier, render_root
from bot.surfaces.slack.views import findings_message, root_message
from bot.surfaces.web.queries import IncidentRecord
from bot.surfaces.web.routes import templates
from bot.surfaces.web.view import incident_page

REPO = Path(__file__).parent.parent
MIXING = CauseVerdict(
    "prefill_decode_mixing",
    "long prefills share scheduler steps with decode",
    "supported",
    "scheduler steps carried up to 4,097–8,192 tokens while 6 requests were decoding",
    "4,097–8,192 tokens in one scheduler step",
)
KV = CauseVerdict(
    "kv_cache_pressure", "KV-cache pressure", "ruled_out",
    "KV cache at 31.0 %, 0 preemptions/s", "KV cache at 31.0 %, 0 preemptions/s",
)  # fmt: skip
GPU = CauseVerdict(
    "gpu_fault", "the GPU itself", "cannot_tell", "not measured: nvml.xid_errors", None,
    ("nvml.xid_errors",),
)  # fmt: skip


def diagnosis(causes: list[CauseVerdict]) -> Diagnosis:
    return Diagnosis(
        target="prod-a", runbook="vllm-latency", headline=Measured.of({"ttft_p99_ms": 19050.0}),
        baseline=Baseline(), matches=[], readings=Measured(), details={}, sampling_s=8.0,
        at=dt.datetime(2026, 12, 2, tzinfo=dt.UTC), causes=causes,
        findings=[Finding(Severity.CRITICAL, "TTFT p99 is 19050 ms, over 500 ms", "demo")],
    )  # fmt: skip


def view(summary: dict[str, object]) -> IncidentView:
    return IncidentView(
        id=3, title="VLLMTimeToFirstTokenP99High", status="firing", source="alertmanager",
        target="prod-a", opened_at=dt.datetime(2026, 12, 2, tzinfo=dt.UTC), closed_at=None,
        state="diagnosed", summary=summary,
    )  # fmt: skip


def test_root_message_leads_with_the_likely_cause_and_its_number() -> None:
    summary = diagnosis([MIXING, KV, GPU]).summary().json_dict()  # as stored
    assert summary["causes"][0] == {
        "cause": "prefill_decode_mixing", "title": MIXING.title, "verdict": "supported",
        "evidence": MIXING.evidence, "number": MIXING.number, "missing": [],
    }  # fmt: skip
    _, blocks = root_message(view(summary))
    line = (
        "likely cause: long prefills share scheduler steps with decode — "
        "4,097–8,192 tokens in one scheduler step"
    )
    assert blocks[2]["text"]["text"] == f"*{line}*"  # right under the status line
    assert render_root(view(summary)).splitlines()[1] == f"    {line}"
    none = diagnosis([KV, GPU]).summary().json_dict()
    assert "*no cause stood out*" in str(root_message(view(none))[1])
    assert "cause" not in str(root_message(view({"headline": {}}))[1])  # not diagnosed yet
    no_hypotheses = diagnosis([]).summary().json_dict()
    assert no_hypotheses["causes"] == []
    assert "cause" not in str(root_message(view(no_hypotheses))[1])  # the runbook names none
    assert "cause" not in render_root(view(no_hypotheses))


def test_findings_message_lists_supported_then_ruled_out_then_gaps_then_findings() -> None:
    text, blocks = findings_message(diagnosis([MIXING, KV, GPU]))
    assert text.startswith("likely cause: long prefills share") and "1 finding(s)" in text
    shown = json.dumps(blocks, ensure_ascii=False)
    order = [
        "likely cause: long prefills",
        f"*{MIXING.title}*: scheduler steps carried up to",
        "ruled out: KV-cache pressure (KV cache at 31.0 %, 0 preemptions/s)",
        "cannot tell: the GPU itself (not measured: nvml.xid_errors)",
        "data gap: no GPU snapshot: configure `ruleloop agent`",
        "TTFT p99 is 19050 ms, over 500 ms",  # the findings still follow
    ]
    places = [shown.find(part) for part in order]
    assert -1 not in places and places == sorted(places), places


def test_no_causes_leave_the_findings_message_as_it_was() -> None:
    _, blocks = findings_message(diagnosis([]))
    assert "cause" not in json.dumps(blocks)


def test_the_console_prints_the_causes_before_the_findings(tmp_path: Path) -> None:
    (message,) = ConsoleNotifier(chart_dir=tmp_path).render_diagnosis(
        diagnosis([MIXING, KV, GPU]), incident_id=3
    )[:1]
    lines = message["text"].splitlines()
    assert lines[1].startswith("  likely cause: long prefills share")
    assert any(
        line.startswith("  ruled out: KV-cache pressure (KV cache at 31.0 %") for line in lines
    )
    assert (
        lines.index("  data gap: no GPU snapshot: configure `ruleloop agent` on the GPU nodes")
        < [i for i, line in enumerate(lines) if "19050 ms" in line][0]
    )


# --- wrong hypothesis files: refused at start and by `ruleloop runbooks validate` ----------------

HEAD = "name: bad\nprobes:\n  - probe: vllm_metrics\n  - probe: nvml\nhypotheses:\n"
GOOD = (
    "  - cause: queueing\n"
    "    supported_when: vllm_metrics.queue_ttft_share > 0.5\n"
    '    number: "{vllm_metrics.queue_ttft_share} queued"\n'
    '    evidence: "queued"\n'
)


@pytest.mark.parametrize(
    ("hypothesis", "expected"),
    [
        (GOOD.replace("queue_ttft_share > 0.5", "queue_tfft_share > 0.5"),
         ":7: hypotheses[0].supported_when: no probe of this runbook yields "
         "vllm_metrics.queue_tfft_share; did you mean vllm_metrics.queue_ttft_share?"),
        (GOOD.replace("> 0.5", "is high"),
         ":7: hypotheses[0].supported_when: 'vllm_metrics.queue_ttft_share is high' is not a "
         "clause: write `probe.reading OP number`"),
        (GOOD.replace("cause: queueing", "cause: cosmic_rays"),
         ":6: hypotheses[0].cause: unknown cause 'cosmic_rays'; write one of prefill_decode_mixing"),
        (GOOD.replace("{vllm_metrics.queue_ttft_share}", "{queue_ttft_share:.0%}"),
         ":8: hypotheses[0].number: {queue_ttft_share:.0%} is not a reading: write "
         "{probe.reading}"),
        (GOOD.replace('"queued"\n', '"{nvml.xid}"\n'),
         ":9: hypotheses[0].evidence: no probe of this runbook yields nvml.xid"),
    ],
)  # fmt: skip
def test_a_wrong_hypothesis_is_refused_with_its_line(
    tmp_path: Path, hypothesis: str, expected: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(HEAD + hypothesis)
    loaded, problems = inspect_file(path, default_registry())
    assert len(problems) == 1 and problems[0].startswith(f"{path}{expected}"), problems
    with pytest.raises(UsageError, match=expected.split(":", 2)[-1][:40].replace("[", r"\[")):
        load_dir(tmp_path, default_registry())  # the bot's start refuses it


def test_declared_causes_extend_the_vocabulary_but_may_not_shadow_it(tmp_path: Path) -> None:
    path = tmp_path / "own.yaml"
    own = "causes:\n  - {name: slow_tokenizer, title: the tokenizer holds up the frontend}\n"
    path.write_text(HEAD.replace("hypotheses:\n", own + "hypotheses:\n")
                    + GOOD.replace("cause: queueing", "cause: slow_tokenizer"))  # fmt: skip
    assert inspect_file(path, default_registry())[1] == []
    path.write_text(HEAD.replace("hypotheses:\n", "causes:\n  - {name: queueing, title: q}\n"
                                 "hypotheses:\n") + GOOD)  # fmt: skip
    (problem,) = inspect_file(path, default_registry())[1]
    assert problem == f"{path}:6: causes[0].name: 'queueing' is a built-in cause: drop it here"


def test_runbooks_validate_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    shipped = [str(REPO / "runbooks"), str(REPO / "bot" / "app" / "demo" / "runbook.yaml")]
    ok = runner.invoke(cli, ["runbooks", "validate", *shipped])
    assert ok.exit_code == 0, ok.output
    assert "ok: 4 runbook file(s) are valid" in ok.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(HEAD + GOOD.replace("cause: queueing", "cause: cosmic_rays") + GOOD)
    refused = runner.invoke(cli, ["runbooks", "validate", str(bad), shipped[0]])
    assert refused.exit_code == 2
    assert f"{bad}:6: hypotheses[0].cause: unknown cause 'cosmic_rays'" in refused.output
    assert "1 problem(s) found; fix them and run again" in refused.output
    assert "Traceback" not in refused.output


def test_the_incident_page_shows_the_same_causes_in_the_same_order() -> None:
    summary = diagnosis([MIXING, KV, GPU]).summary().json_dict()
    record = IncidentRecord(
        id=3, title="VLLMTimeToFirstTokenP99High", status="firing", source="alertmanager",
        target="prod-a", labels={}, opened_at=dt.datetime(2026, 12, 2, tzinfo=dt.UTC),
        closed_at=None, summary=summary,
    )  # fmt: skip
    page = incident_page(record, adr=lambda _: None, markdown=lambda _: "")
    html = templates().get_template("incident.html.j2").render(page=page, chart_url="")
    likely = re.search(r'id="likely-cause"><strong>([^<]+)<', html)
    assert likely and likely[1] == (
        "likely cause: long prefills share scheduler steps with decode — "
        "4,097–8,192 tokens in one scheduler step"
    )
    order = [
        f"<strong>{MIXING.title}</strong>: scheduler steps carried up to",
        "ruled out</span>KV-cache pressure (KV cache at 31.0 %, 0 preemptions/s)",
        "cannot tell</span>the GPU itself (not measured: nvml.xid_errors)",
        "data gap: no GPU snapshot: configure `ruleloop agent`",
        "TTFT p99 is 19050 ms, over 500 ms",
    ]
    places = [html.find(part) for part in order]
    assert -1 not in places and places == sorted(places), places
    bare = incident_page(
        IncidentRecord(**{**record.__dict__, "summary": {"headline": {"ttft_p99_ms": 1.0}}}),
        adr=lambda _: None, markdown=lambda _: "",
    )  # fmt: skip
    assert bare.cause_line is None and bare.causes is None  # before causes existed
