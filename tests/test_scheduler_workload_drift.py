"""The workload-drift job in a real bot (create_bot against the fake Slack), period by period on
a controlled clock: the engine's /metrics is served at the wire, growing by the requests of the
traffic the test sends; the canary gate is the one thing replaced (no engine here). The same
path against a real engine: tests/test_workload_drift_engine.py."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bot.adr.models import AdrGates
from bot.adr.workload.shape import WorkloadShape
from bot.app.scheduler.runner import RunResult
from bot.canary.verdict import gates_from, judged
from bot.kernel.config import CanarySpec
from bot.kernel.store import service as store
from bot.kernel.store.models import Incident, Remediation
from bot.remediation.gate import GateRun
from tests import store_reads
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import FakeSlack
from tests.workload_pages import chat, vllm_page

ADR = "ADR-20260831-01"  # gates: TTFT p99 <= 350 ms, TPOT p99 <= 35 ms, goodput >= 95 %
PER_SCRAPE = 20  # requests that finish between two scrapes (5 s apart): 4 req/s, as chat()


class Traffic:
    """The engine's /metrics: counters since start, growing by PER_SCRAPE requests of the
    current kind on every scrape (chat turns, or agents behind a long system prompt)."""

    def __init__(self) -> None:
        self.kind = "chat"
        self.prompts: list[int] = []
        self.outputs: list[int] = []
        self._rng = random.Random(7)

    def _next(self) -> None:
        for _ in range(0 if self.kind == "idle" else PER_SCRAPE):
            low, high = (2100, 3900) if self.kind == "agents" else (64, 192)
            self.prompts.append(self._rng.randint(low, high))
            self.outputs.append(self._rng.randint(50, 400))

    def transport(self) -> httpx.MockTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            if request.url.path != "/metrics":
                return httpx.Response(404)
            self._next()
            page = vllm_page(prompts=self.prompts, outputs=self.outputs, running=3.0,
                             hits=0.3 * sum(self.prompts), queries=sum(self.prompts))  # fmt: skip
            return httpx.Response(200, text=page)

        return httpx.MockTransport(handler)


class ShapeCanary:
    """The canary gate without an engine: it records the shape it was asked to replay and
    reports the TTFT it is told."""

    def __init__(self) -> None:
        self.ttft_p99_ms = 180.0
        self.tpot_p99_ms = 21.5
        self.shapes: list[WorkloadShape | None] = []
        self.gates: list[AdrGates] = []

    async def __call__(
        self, base_url: str, spec: CanarySpec, gates: AdrGates, *, shape: Any = None,
        **judging: Any,
    ) -> GateRun:
        self.shapes.append(shape)
        self.gates.append(gates)
        report = {"ttft_ms": {"p99": self.ttft_p99_ms}, "tpot_ms": {"p99": self.tpot_p99_ms},
                  "goodput_ratio": 0.99, "kv_fragmentation": {"observed": 0.12},
                  "requests": {"total": 32, "failed": 0}}  # fmt: skip
        return judged(report, gates_from(gates))


def record_workload(adr_dir: Path, shape: WorkloadShape) -> None:
    """The seed ADR, as if it had been measured under ``shape`` (its front matter's workload)."""
    path = next(adr_dir.glob(f"{ADR}-*.md"))
    _, front, body = path.read_text().split("---\n", 2)
    data = yaml.safe_load(front) | {"workload": shape.model_dump(mode="json")}
    path.write_text("---\n" + yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
                    + "---\n" + body)  # fmt: skip


def set_gates(h: Harness, gates: str) -> None:
    """The seed ADR's gates replaced by ``gates`` (front-matter lines)."""
    path = next(Path(h.bot.flows.settings.paths.adr).glob(f"{ADR}-*.md"))
    text = path.read_text()
    start = text.index("gates:\n") + len("gates:\n")
    end = start
    while text.startswith("  ", end):  # the gates block: its indented lines
        end = text.index("\n", end) + 1
    path.write_text(text[:start] + gates + text[end:])


def promote_with_before(h: Harness, before: dict[str, float]) -> None:
    """The seed ADR put in force on prod-a by a change whose before-run (under the incident's
    workload, not the live one) measured ``before``."""
    with h.bot.db.transaction() as s:
        incident = store.create(s, key="k", source="slash", title="t", target="prod-a",
                                labels={}, at=h.wall.now())  # fmt: skip
        s.add(Remediation(incident_id=incident.id, adr_id=ADR, target="prod-a",
                          requested_by="U1", state="promoted", approvals_needed=1,
                          result={"before_numbers": before},
                          created_at=h.wall.now(), updated_at=h.wall.now()))  # fmt: skip


@pytest.fixture
def traffic() -> Traffic:
    return Traffic()


@pytest.fixture
def canary() -> ShapeCanary:
    return ShapeCanary()


@pytest.fixture
async def h(
    tmp_path: Path, slack: FakeSlack, canary: ShapeCanary, traffic: Traffic
) -> AsyncIterator[Harness]:
    scheduler = {"workload_every_s": 300, "workload_window_s": 60,
                 "targets": {"prod-a": {"adrs": [ADR]}}}  # fmt: skip
    harness_ = harness(tmp_path, slack=slack, scheduler=scheduler, transport=traffic.transport(),
                       bot_options={"gate": canary})  # fmt: skip
    record_workload(Path(harness_.bot.flows.settings.paths.adr), chat())
    yield harness_
    await harness_.close()


async def tick(h: Harness, *, after_s: float = 0) -> RunResult:
    assert h.bot.scheduler is not None
    h.wall.advance(after_s)
    job = next(j for j in h.bot.scheduler.jobs if j.name == "workload:prod-a")
    (result,) = await h.bot.scheduler.runner.tick(job)
    await h.bot.tasks.drain()
    return result


def incidents(h: Harness) -> list[Incident]:
    with h.bot.db.transaction() as s:
        return list(store_reads.incidents(s))


async def test_traffic_like_the_adrs_posts_nothing(
    h: Harness, slack: FakeSlack, canary: ShapeCanary
) -> None:
    result = await tick(h)
    assert result.state == "done", result.detail
    assert result.detail["drifted"] == [], result.detail["dimensions"]
    assert result.detail["adrs"] == [ADR]
    assert incidents(h) == [] and slack.of("chat.postMessage") == []
    assert canary.shapes == []  # nothing to re-validate


async def test_drift_posts_one_thread_with_the_gates_under_the_live_traffic_until_it_returns(
    h: Harness, slack: FakeSlack, canary: ShapeCanary, traffic: Traffic
) -> None:
    traffic.kind = "agents"  # a new workflow with a long system prompt
    drift = await tick(h)
    assert drift.detail["drifted"] == [ADR] and drift.detail["opened"]
    (incident,) = incidents(h)
    assert (incident.source, incident.status, incident.target) == ("scheduler", "firing", "prod-a")
    assert incident.title == f"Workload drift on prod-a: {ADR} measured on other traffic"
    (replayed,) = canary.shapes  # the gates ran under the live shape, not the ADR's
    assert replayed is not None and replayed.prompt_tokens.p50 > 2000

    root, thread = slack.of("chat.postMessage")
    assert "Workload drift on prod-a" in root.args["text"]
    text = thread.args["text"]
    assert thread.args["thread_ts"] == root.args.get("ts", thread.args["thread_ts"])
    assert f"*{ADR}* was measured at prompt p50 " in text
    assert "Production now sends prompt p50 2,000–5,000" in text  # vLLM's bucket, no point
    assert "What moved:\n• prompt tokens distribution: " in text
    assert ":white_check_mark: Under it the gates still hold" in text
    assert ":white_check_mark: TTFT p99 180ms (gate ≤ 350ms, ADR-20260831-01)" in text

    again = await tick(h, after_s=300)  # still drifting: one thread, nothing new
    assert again.detail["opened"] is False and again.detail["incident"] == incident.id
    assert len(slack.of("chat.postMessage")) == 2 and len(canary.shapes) == 1

    traffic.kind = "chat"
    back = await tick(h, after_s=300)  # each period's window holds only what finished in it
    assert back.detail["drifted"] == [] and back.detail["resolved"] == incident.id
    assert incidents(h)[0].status == "resolved"
    assert (
        slack.of("chat.postMessage")[-1]
        .args["text"]
        .startswith(f":white_check_mark: *prod-a* sends the traffic {ADR} was measured under again")
    )


async def test_drift_under_which_the_gates_fail_says_so_in_the_title_and_thread(
    h: Harness, slack: FakeSlack, canary: ShapeCanary, traffic: Traffic
) -> None:
    traffic.kind = "agents"
    canary.ttft_p99_ms = 900.0
    await tick(h)
    (incident,) = incidents(h)
    assert incident.title.endswith(f"; under it {ADR}: gates fail: TTFT p99 900ms > 350ms")
    text = slack.of("chat.postMessage")[-1].args["text"]
    assert ":x: Under it the gates fail" in text and ":x: TTFT p99 900ms" in text


async def test_a_gate_relative_to_a_before_on_other_traffic_is_not_judged_nor_said_to_hold(
    h: Harness, slack: FakeSlack, canary: ShapeCanary, traffic: Traffic
) -> None:
    # TPOT p99 <= 0.5x before, the before measured under the incident's workload (1,923.4 ms):
    # 961.7 ms against a replay of the live traffic could not fail. Not judged, and said so.
    set_gates(h, "  max_tpot_p99_ms: 0.5x before\n")
    promote_with_before(h, {"ttft_p99_ms": 4500.0, "tpot_p99_ms": 1923.4})
    traffic.kind = "agents"
    canary.tpot_p99_ms = 27.7
    drift = await tick(h)
    assert drift.detail.get("opened"), drift.detail
    assert canary.shapes == []  # nothing to judge: no canary run
    reason = "its before was measured under the incident's workload, not the live one"
    assert drift.detail["revalidated"] == [
        f"{ADR}: judged nothing; not judged: max_tpot_p99_ms 0.5x before: {reason}"
    ]
    (incident,) = [i for i in incidents(h) if i.source == "scheduler"]  # not the change's
    assert incident.title.endswith(f"; not re-validated: {ADR}")
    assert incident.labels["severity"] == "info"  # nothing failed, and nothing passed either
    text = slack.of("chat.postMessage")[-1].args["text"]
    verdict = text.split("What moved:", 1)[1]
    assert "hold" not in verdict and ":white_check_mark:" not in verdict
    assert "961.7" not in text
    assert ":warning: Under it nothing was judged" in verdict
    assert f":heavy_minus_sign: Not judged: max_tpot_p99_ms 0.5x before: {reason}" in verdict
    assert "run the flags serving before" in verdict and "add an absolute gate" in verdict


async def test_the_absolute_gate_is_judged_and_fails_while_the_relative_one_is_not_judged(
    h: Harness, slack: FakeSlack, canary: ShapeCanary, traffic: Traffic
) -> None:
    set_gates(h, "  max_ttft_p99_ms: 0.5x before\n  max_tpot_p99_ms: 25.0\n")
    promote_with_before(h, {"ttft_p99_ms": 4500.0, "tpot_p99_ms": 1923.4})
    traffic.kind = "agents"
    canary.tpot_p99_ms = 27.7  # the fix no longer helps under the drifted workload
    drift = await tick(h)
    (judged,) = canary.gates
    assert judged.max_tpot_p99_ms == 25.0
    assert judged.max_ttft_p99_ms is None  # not 2,250 ms from the other workload's before
    reason = "its before was measured under the incident's workload, not the live one"
    assert drift.detail["revalidated"] == [
        f"{ADR}: gates fail: TPOT p99 27.7ms > 25ms; "
        f"not judged: max_ttft_p99_ms 0.5x before: {reason}"
    ]
    (incident,) = [i for i in incidents(h) if i.source == "scheduler"]
    assert incident.title.endswith(f"; under it {ADR}: gates fail: TPOT p99 27.7ms > 25ms")
    assert incident.labels["severity"] == "warning"
    text = slack.of("chat.postMessage")[-1].args["text"]
    assert ":x: Under it the gates fail" in text
    assert ":x: TPOT p99 27.7ms (gate ≤ 25ms, ADR-20260831-01)" in text
    assert f":heavy_minus_sign: Not judged: max_ttft_p99_ms 0.5x before: {reason}" in text
    assert "TTFT p99 180ms (gate" not in text  # the relative gate has no line of its own


async def test_judged_gates_that_hold_say_which_were_not_judged(
    h: Harness, slack: FakeSlack, canary: ShapeCanary, traffic: Traffic
) -> None:
    set_gates(h, "  max_ttft_p99_ms: 0.5x before\n  max_tpot_p99_ms: 35.0\n")
    promote_with_before(h, {"ttft_p99_ms": 4500.0})
    traffic.kind = "agents"
    drift = await tick(h)
    assert drift.detail["revalidated"][0].startswith(
        f"{ADR}: the gates judged hold; not judged: max_ttft_p99_ms 0.5x before: "
    )
    text = slack.of("chat.postMessage")[-1].args["text"]
    assert ":white_check_mark: Under it the gates judged hold" in text
    assert "gates still hold" not in text
    assert ":heavy_minus_sign: Not judged: max_ttft_p99_ms 0.5x before: " in text


async def test_a_window_without_traffic_is_unknown_and_leaves_the_thread_open(
    h: Harness, slack: FakeSlack, traffic: Traffic
) -> None:
    traffic.kind = "agents"
    await tick(h)
    traffic.kind = "idle"
    idle = await tick(h, after_s=300)
    assert idle.detail["skipped"].startswith("no live shape this period")
    assert incidents(h)[0].status == "firing"  # unknown is not "alike": nothing closed


async def test_an_adr_without_a_recorded_workload_is_not_compared(
    tmp_path: Path, slack: FakeSlack, canary: ShapeCanary, traffic: Traffic
) -> None:
    h = harness(tmp_path, slack=slack, transport=traffic.transport(), bot_options={"gate": canary},
                scheduler={"targets": {"prod-a": {"adrs": [ADR]}}})  # fmt: skip
    try:
        traffic.kind = "agents"
        result = await tick(h)
        assert result.detail["skipped"].startswith("no ADR in force records the workload")
        assert incidents(h) == [] and canary.shapes == []
    finally:
        await h.close()
