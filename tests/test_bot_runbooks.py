"""Runbooks: the registry's checks, the loader's refusals at startup, selection, the runner."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import httpx
import pytest

from bot.diagnosis.probes.context import ProbeContext, TargetRef
from bot.diagnosis.probes.types import Finding, Params, ProbeResult, Severity
from bot.diagnosis.runbooks.builtin import default_registry
from bot.diagnosis.runbooks.loader import load_dir, load_file
from bot.diagnosis.runbooks.registry import ProbeRegistry
from bot.diagnosis.runbooks.runner import RunbookRunner
from bot.kernel.config import Target
from bot.kernel.errors import ProbeError, UsageError
from bot.kernel.numbers import Measured

SHIPPED = Path(__file__).parent.parent / "runbooks"


class StubParams(Params):
    level: float = 1.0


class StubProbe:
    """A probe that reads its own parameter back (a real Probe, not a mock)."""

    name: ClassVar[str] = "stub"
    params_model: ClassVar[type[Params]] = StubParams

    def readings(self, params: Params) -> dict[str, str]:
        return {"level": "the level parameter", "never": "always unmeasured"}

    async def run(self, *, target: TargetRef, params: Params, ctx: ProbeContext) -> ProbeResult:
        assert isinstance(params, StubParams)
        if params.level < 0:
            raise ProbeError("the stub cannot read negative levels")
        if params.level == 13:
            raise ZeroDivisionError("bug")
        return ProbeResult(readings=Measured.of({"level": params.level, "never": None}),
                           findings=[Finding(Severity.INFO, "stub ran", "stub")])  # fmt: skip


def registry() -> ProbeRegistry:
    return ProbeRegistry([StubProbe()])


def write(tmp_path: Path, text: str, name: str = "rb.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD = """
name: stub-book
match: {alertname: [A, B], severity: page}
probes: [{probe: stub, params: {level: 5}}]
findings:
  - {when: stub.level > 3, severity: critical, message: "level {value:.0f} over {limit:.0f}"}
  - {when: stub.level < 3, severity: info, message: "low"}
  - {when: stub.never > 0, severity: critical, message: "never"}
"""


def test_shipped_runbooks_load_with_builtin_probes() -> None:
    runbooks = load_dir(SHIPPED, default_registry())
    assert runbooks.select({"alertname": "VLLMTimeToFirstTokenP99High"}).name == "vllm-latency"  # type: ignore[union-attr]
    assert runbooks.select({"alertname": "SomethingElse"}).name == "default"  # type: ignore[union-attr]
    assert default_registry().names() == ["nvml", "prometheus", "queue_cancel", "vllm_metrics"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\nprobes: [{probe: nope}]\n", r"probes\[0\]: unknown probe 'nope'; known: stub"),
        ("name: x\nprobes: [{probe: stub, params: {levl: 1}}]\n", r"params.levl: Extra inputs"),
        ("name: x\nprobes: [{probe: stub, params: {level: hi}}]\n", r"params.level"),
        ("name: x\nprobes: []\n", "probes: List should have at least 1"),
        ("name: Bad Name\nprobes: [{probe: stub}]\n", "name: String should match"),
        ("name: x\nprobes: [{probe: stub}]\nfindings: [{when: stub.lvl > 1, severity: info, message: m}]\n",
         r"findings\[0\]: no probe of this runbook yields stub.lvl"),
        ("name: x\nprobes: [{probe: stub}]\nfindings: [{when: 'stub.level ~ 1', severity: info, message: m}]\n",
         "is not `probe.reading OP number`"),
        ("name: x\nprobes: [{probe: stub}]\nfindings: [{when: stub.level > 1, severity: page, message: m}]\n",
         "severity must be one of"),
        ("name: x\nprobes: [{probe: stub}]\nfindings: [{when: stub.level > 1, severity: info, message: '{x}'}]\n",
         "may use only"),
        ("name: x\nprobes: [{probe: stub}]\nextra: 1\n", "extra: Extra inputs"),
        ("name: [x\n", "not valid YAML"),
    ],
)  # fmt: skip
def test_loader_refuses_at_startup(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load_file(write(tmp_path, text), registry())


def test_loader_refuses_duplicate_names_and_empty_dirs(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no runbooks"):
        load_dir(tmp_path, registry())
    with pytest.raises(UsageError, match="does not exist"):
        load_dir(tmp_path / "none", registry())
    write(tmp_path, GOOD, "a.yaml")
    write(tmp_path, GOOD, "b.yml")
    with pytest.raises(UsageError, match="'stub-book' is also used by"):
        load_dir(tmp_path, registry())


@pytest.mark.parametrize(
    ("labels", "chosen"),
    [
        ({"alertname": "A", "severity": "page"}, "stub-book"),
        ({"alertname": "B", "severity": "page", "x": "y"}, "stub-book"),
        ({"alertname": "A", "severity": "ticket"}, "catch-all"),
        ({}, "catch-all"),
    ],
)
def test_select_most_specific(tmp_path: Path, labels: dict[str, str], chosen: str) -> None:
    write(tmp_path, GOOD, "a.yaml")
    write(tmp_path, "name: catch-all\nprobes: [{probe: stub}]\n", "b.yaml")
    assert load_dir(tmp_path, registry()).select(labels).name == chosen  # type: ignore[union-attr]


def test_registry_refuses_bad_probes() -> None:
    class NoName:
        params_model = StubParams

        async def run(self, *, target: object, params: object, ctx: object) -> None: ...

    class SyncRun(StubProbe):
        def run(self, *, target: object, params: object, ctx: object) -> None:  # type: ignore[override]
            return None

    class WrongModel(StubProbe):
        params_model = dict  # type: ignore[assignment]

    for probe, message in ((NoName(), "needs a `name`"), (SyncRun(), "async def run"),
                           (WrongModel(), "params_model must subclass")):  # fmt: skip
        with pytest.raises(UsageError, match=message):
            ProbeRegistry([probe])  # type: ignore[list-item]
    with pytest.raises(UsageError, match="registered twice"):
        ProbeRegistry([StubProbe(), StubProbe()])


async def _run(tmp_path: Path, text: str) -> object:
    loaded = load_file(write(tmp_path, text), registry())
    ctx = ProbeContext(
        http=httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(404)))
    )
    target = TargetRef("a", Target(vllm_url="http://e:1"))
    return await RunbookRunner(registry=registry()).run(loaded, target=target, ctx=ctx)


async def test_runner_turns_readings_into_findings(tmp_path: Path) -> None:
    result = await _run(tmp_path, GOOD)
    assert result.readings.numbers == {"stub.level": 5.0, "stub.never": None}  # type: ignore[attr-defined]
    assert [(f.severity, f.message) for f in result.findings] == [  # type: ignore[attr-defined]
        (Severity.CRITICAL, "level 5 over 3"),
        (Severity.INFO, "stub ran"),
    ]


@pytest.mark.parametrize(
    ("level", "message"),
    [(-1, "stub could not run: the stub cannot read negative levels"),
     (13, r"stub failed unexpectedly \(id [0-9a-f]{8}; details in the bot's log\)")],
)  # fmt: skip
async def test_runner_probe_failure_is_a_finding(
    tmp_path: Path, level: int, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    result = await _run(
        tmp_path, f"name: x\nprobes: [{{probe: stub, params: {{level: {level}}}}}]\n"
    )
    (finding,) = result.findings  # type: ignore[attr-defined]
    assert finding.severity is Severity.WARNING
    import re

    assert re.fullmatch(message, finding.message)
    if level == 13:
        error_id = finding.message.split("id ")[1][:8]
        assert error_id in caplog.text and "ZeroDivisionError" in caplog.text
