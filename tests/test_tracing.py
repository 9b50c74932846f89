"""Traces as a collector receives them: ``[tracing] otlp_endpoint`` set, the real bot
(tests/fakes/bot.py: real store, Slack faked at the wire) sends OTLP/HTTP protobuf to a local
collector at the wire (a real HTTP server taking POST /v1/traces, each body decoded with
opentelemetry-proto's ExportTraceServiceRequest). An alert is one trace: the webhook, its intake,
the diagnosis (with its probes) and the Slack deliveries, parented by the webhook; a change is a
trace of its own: the remediation and its steps, each with the change's id. Off (no endpoint),
nothing is sent; a collector that is down costs the spans (logged), never the alert.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from bot.kernel import Settings, UsageError
from bot.kernel.runtime import Tracing
from tests.fakes.alerts import alert, body
from tests.fakes.bot import Harness, adr_dir, harness
from tests.fakes.slack_api import FakeSlack
from tests.fakes.sse_engine import SseEngine
from tests.test_adr_relative_flow import MemoryActuator
from tests.test_cause_feedback_thread import runbook
from tests.test_hold_for_a_person import HOLD_ADR, eight_requests
from tests.test_standing_guardrails import ADR, SLOW_TTFT_ADR, SlowTtftCanary


@dataclass
class Span:
    """One span as the collector received it."""

    name: str
    trace_id: str
    span_id: str
    parent: str
    attributes: dict[str, Any]
    service: str
    links: list[str] = field(default_factory=list)  # the span ids it links to


def value_of(any_value: AnyValue) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def spans_of(request: ExportTraceServiceRequest) -> list[Span]:
    found = []
    for resource_spans in request.resource_spans:
        resource = {a.key: value_of(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                found.append(Span(
                    name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                    parent=s.parent_span_id.hex(), service=resource["service.name"],
                    attributes={a.key: value_of(a.value) for a in s.attributes},
                    links=[link.span_id.hex() for link in s.links],
                ))  # fmt: skip
    return found


class Collector:
    """An OTLP/HTTP collector at the wire: POST /v1/traces, protobuf bodies, kept decoded."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests: list[tuple[str, str]] = []  # (path, content type)
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                data = self.rfile.read(int(self.headers["Content-Length"]))
                collector.requests.append((self.path, self.headers["Content-Type"]))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(data)
                collector.spans += spans_of(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def named(self, name: str) -> list[Span]:
        return [s for s in self.spans if s.name == name]


@pytest.fixture
def collector() -> Iterator[Collector]:
    served = Collector()
    try:
        yield served
    finally:
        served.close()


def tracing_of(h: Harness) -> Tracing:
    assert h.bot.tracing is not None
    return h.bot.tracing


async def finished(h: Harness) -> None:
    """Drain the bot's work, close it and send every span (the provider shut down after)."""
    try:
        await h.bot.tasks.drain()
        if h.bot.tracing is not None:
            assert h.bot.tracing.flush(timeout_s=10)
    finally:
        await h.close()
        if h.bot.tracing is not None:
            h.bot.tracing.shutdown()


def ancestors(span: Span, by_id: dict[str, Span]) -> list[str]:
    """The names up the span's parent chain, nearest first."""
    chain = []
    while span.parent:
        span = by_id[span.parent]
        chain.append(span.name)
    return chain


async def test_an_alert_is_one_trace_from_the_webhook_to_slack(
    tmp_path: Path, slack: FakeSlack, collector: Collector
) -> None:
    runbooks = tmp_path / "cause-runbooks"  # the test runbook, with a cause it supports
    runbooks.mkdir()
    (runbooks / "test.yaml").write_text(runbook("vllm_metrics.ttft_p99_ms > 1"))
    paths = {"runbooks": str(runbooks), "adr": str(adr_dir(tmp_path, matching=False))}
    h = harness(tmp_path, slack=slack, paths=paths, tracing={"otlp_endpoint": collector.url + "/"})
    try:
        opened = await h.webhook(body(alert()))
        incident = opened.json()["incident"]
        await slack.until("chat.update")
    finally:
        await finished(h)
    assert {path for path, _ in collector.requests} == {"/v1/traces"}
    assert {kind for _, kind in collector.requests} == {"application/x-protobuf"}
    (webhook,) = collector.named("alertmanager.webhook")
    assert webhook.parent == "" and webhook.service == "ruleloop"
    assert webhook.attributes["http.response.status_code"] == 202
    (intake,) = collector.named("intake")
    assert intake.parent == webhook.span_id
    assert intake.attributes["outcome"] == "opened" and intake.attributes["incidents"] == 1
    (diagnosis,) = collector.named("diagnosis")
    assert diagnosis.attributes["incident_id"] == incident
    assert diagnosis.attributes["target"] == "prod-a"
    assert diagnosis.attributes["runbook"] == "test-latency"  # tests/fakes/bot.py's RUNBOOK
    assert diagnosis.attributes["cause"] == "kv_cache_pressure"
    by_id = {s.span_id: s for s in collector.spans}
    assert {s.trace_id for s in collector.spans} == {webhook.trace_id}  # one trace, all of it
    assert ancestors(diagnosis, by_id)[-1] == "alertmanager.webhook"
    probes = [s for s in collector.spans if s.name.startswith("probe.")]
    assert probes and all(p.parent == diagnosis.span_id for p in probes), probes
    assert all(p.attributes["incident_id"] == incident for p in probes)
    deliveries = collector.named("slack.deliver")
    assert sum(d.attributes["sent"] for d in deliveries) >= 2  # the root and the diagnosis
    for delivery in deliveries:
        assert delivery.attributes["incident_id"] == incident
        assert "alertmanager.webhook" in ancestors(delivery, by_id)
    # the diagnosis's messages went out inside it
    assert any(diagnosis.span_id == d.parent and d.attributes["sent"] for d in deliveries)


def make_change(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine, gate: Callable[..., Any], adr: str,
    endpoint: str, *, baseline: bool,
) -> Harness:  # fmt: skip
    spec: dict[str, Any] = {"vllm_url": engine.base_url, "actuator": {"kind": "dry-run"},
                            "canary": {"baseline": baseline}}  # fmt: skip
    h = harness(
        tmp_path, slack=slack, transport=httpx.MockTransport(lambda r: httpx.Response(404)),
        bot_options={"gate": gate, "actuator_for": MemoryActuator}, targets={"prod-a": spec},
        tracing={"otlp_endpoint": endpoint, "service_name": "ruleloop-test"},
    )  # fmt: skip
    (tmp_path / "adr" / f"{ADR}-fewer-sequences.md").write_text(adr)
    return h


@pytest.fixture
async def engine() -> AsyncIterator[SseEngine]:
    """What a rollback's check that the engine serves again asks (one short completion)."""
    async with SseEngine() as served:
        yield served


@pytest.mark.parametrize(
    ("gate", "adr", "state", "verdict", "steps"),
    [
        (SlowTtftCanary(), SLOW_TTFT_ADR, "promoted", "met", ["apply", "canary", "promote"]),
        (eight_requests, HOLD_ADR.format(limit=1, inconclusive="hold"), "rolled_back",
         "missed", ["before_run", "apply", "canary", "rollback"]),  # the canary's baseline on
    ],
    ids=["promoted", "rolled-back"],
)  # fmt: skip
async def test_a_change_is_a_trace_of_its_own_with_a_span_per_step(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine, collector: Collector,
    gate: Callable[..., Any], adr: str, state: str, verdict: str, steps: list[str],
) -> None:  # fmt: skip
    h = make_change(tmp_path, slack, engine, gate, adr, collector.url,
                    baseline="before_run" in steps)  # fmt: skip
    try:
        await h.bot.remediation.request(user_id="U1", adr_id=ADR, target="prod-a")
        rem = await h.approve_change()
    finally:
        await finished(h)
    assert rem.state == state, rem.result
    (root,) = collector.named("remediation")
    assert root.parent == "" and root.service == "ruleloop-test"
    assert root.attributes["change_id"] == rem.id
    assert root.attributes["adr_id"] == ADR and root.attributes["target"] == "prod-a"
    assert root.attributes["verdict"] == state
    if rem.incident_id is not None:
        assert root.attributes["incident_id"] == rem.incident_id
    change = [s for s in collector.spans if s.trace_id == root.trace_id]
    by_id = {s.span_id: s for s in change}
    names = [s.name for s in change]
    assert sorted(names) == sorted(["remediation", *steps]), names
    for s in change:
        assert s.attributes["change_id"] == rem.id, s
        assert s is root or ancestors(s, by_id)[-1] == "remediation", s
    (canary,) = [s for s in change if s.name == "canary"]
    assert canary.attributes["verdict"] == verdict
    if state == "rolled_back":  # the step that failed rolls it back
        assert by_id[next(s for s in change if s.name == "rollback").parent].name == "canary"


async def test_without_an_endpoint_nothing_is_sent(
    tmp_path: Path, slack: FakeSlack, collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness(tmp_path, slack=slack)
    assert h.bot.tracing is None
    try:
        opened = await h.webhook(body(alert()))
        assert opened.status_code == 202
        await slack.until("chat.update")
    finally:
        await finished(h)
    assert collector.requests == [] and collector.spans == []


def closed_port() -> str:
    """A local address where nothing listens (connections refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_a_dead_collector_costs_the_spans_not_the_alert(
    tmp_path: Path, slack: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint = closed_port()
    h = harness(tmp_path, slack=slack, tracing={"otlp_endpoint": endpoint, "timeout_s": 0.5})
    caplog.set_level(logging.WARNING, logger="opentelemetry")
    try:
        opened = await h.webhook(body(alert()))
        assert opened.status_code == 202
        await slack.until("chat.update")  # the diagnosis posted
        await h.bot.tasks.drain()
        tracing_of(h).flush(timeout_s=5)  # sent nowhere: it returns, raising nothing
    finally:
        await h.close()
        tracing_of(h).shutdown()
    assert [c for c in slack.calls if c.method == "chat.postMessage"]
    failed = [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")]
    assert failed and any(r.levelno >= logging.ERROR for r in failed), caplog.records
    assert any("Failed to export spans" in r.getMessage() for r in failed), failed


async def test_a_sample_ratio_of_0_sends_no_trace(
    tmp_path: Path, slack: FakeSlack, collector: Collector
) -> None:
    h = harness(tmp_path, slack=slack, tracing={"otlp_endpoint": collector.url, "sample_ratio": 0})
    try:
        assert (await h.webhook(body(alert()))).status_code == 202
        await slack.until("chat.update")
    finally:
        await finished(h)
    assert collector.spans == []  # the webhook's span was dropped, and its children with it


def test_the_standard_variable_turns_tracing_on_and_a_bad_url_is_refused() -> None:
    settings = Settings.load({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector:4318/"})
    assert settings.tracing.otlp_endpoint == "http://otel-collector:4318"
    assert Settings.load({}).tracing.otlp_endpoint is None  # off by default
    with pytest.raises(UsageError, match="tracing.otlp_endpoint: .*not an http"):
        Settings.load({"OTEL_EXPORTER_OTLP_ENDPOINT": "otel-collector:4317"})
