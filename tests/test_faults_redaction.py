"""Credentials in target URLs never leave the bot (docs/reliability.md): with a `vllm_url` and a
`prometheus_url` of the form ``http://user:PASSWORD@host``, a failing probe's error text names
the URL without its user info, in the Slack thread, the audit log and the incident page.

Through the real bot: the webhook over ASGI, real SQLite, the fake Slack Web API at the wire,
the engine and Prometheus failing at the HTTP transport."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from bot.kernel.runtime.redact import redact
from tests import store_reads
from tests.fakes.alerts import alert, body
from tests.fakes.bot import harness
from tests.fakes.slack_api import FakeSlack

pytestmark = pytest.mark.faults

ENGINE_PASSWORD = "engine-PASSWORD-9f3a"
PROM_PASSWORD = "prom-PASSWORD-77c1"
RUNBOOK = """
name: test-credentials
probes:
  - {probe: vllm_metrics, params: {window_s: 2, interval_s: 1}}
  - probe: prometheus
    params: {minutes: 5, queries: {up: 'up{instance="$instance"}'}}
findings:
  - {when: vllm_metrics.ttft_p99_ms > 1, severity: critical, message: "TTFT p99 {value:.0f} ms"}
"""
LINK = re.compile(r"<(https://ruleloop\.example\.com/incidents/\d+\?[^|>]+)\|incident page>")


def failing() -> httpx.MockTransport:
    """The engine answers 503; Prometheus cannot be reached (the error names the URL, as
    httpx's do for some failures)."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "prometheus.example":
            raise httpx.ConnectError(f"cannot connect to {request.url}", request=request)
        return httpx.Response(503, text="engine overloaded")

    return httpx.MockTransport(handler)


async def test_a_failing_probe_never_shows_the_password_of_its_url(
    tmp_path: Path, slack: FakeSlack
) -> None:
    """The probes' error texts quoted the configured URL whole: the password was in the
    thread, the audit log and the page."""
    runbooks = tmp_path / "creds-runbooks"
    runbooks.mkdir()
    (runbooks / "test.yaml").write_text(RUNBOOK)
    target = {
        "vllm_url": f"http://ruleloop:{ENGINE_PASSWORD}@10.0.0.5:8000",
        "prometheus_url": f"http://reader:{PROM_PASSWORD}@prometheus.example:9090",
        "actuator": {"kind": "dry-run"},
    }
    h = harness(
        tmp_path, slack=slack, transport=failing(), targets={"prod-a": target},
        paths={"runbooks": str(runbooks), "adr": str(tmp_path / "adr")},
        web={"link_secret": "redaction-test-secret-0123456789abcdef",
             "public_url": "https://ruleloop.example.com"},
    )  # fmt: skip
    try:
        response = await h.webhook(body(alert(ruleloop_target="prod-a")))
        assert response.status_code == 202, response.text
        await h.bot.tasks.drain()
        sent = json.dumps([c.args for c in slack.calls])
        with h.bot.db.transaction() as s:
            audit = json.dumps([(e.action, e.detail, e.note) for e in store_reads.audit_trail(s)])
        found = LINK.search(json.dumps(slack.of("chat.postMessage")[0].args["blocks"]))
        assert found
        link = found[1].replace("&amp;", "&").removeprefix("https://ruleloop.example.com")
        page = (await h.client.get(link)).text
        # the probes did fail, and their errors did reach all three, naming the hosts
        for shown in (sent, audit, page):
            assert "could not run" in shown
            assert "10.0.0.5:8000" in shown and "prometheus.example:9090" in shown
        for password in (ENGINE_PASSWORD, PROM_PASSWORD):
            assert password not in sent
            assert password not in audit
            assert password not in page
            assert password not in h.console.getvalue()
    finally:
        await h.close()


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "cannot scrape http://u:p@h:8000/metrics: boom",
            "cannot scrape http://***@h:8000/metrics: boom",
        ),
        ("https://user@host/x and HTTP://a:b@c:1", "https://***@host/x and HTTP://***@c:1"),
        ("http://u:p@ss@h/x?q=a@b", "http://***@h/x?q=a@b"),  # an unencoded @ in the password
        ("http://h:8000/metrics, no user", "http://h:8000/metrics, no user"),
        ("mail ops@example.com", "mail ops@example.com"),
    ],
)
def test_redact_removes_the_user_info_of_every_url_in_a_text(text: str, shown: str) -> None:
    assert redact(text) == shown
