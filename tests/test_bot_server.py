"""/alertmanager, /healthz, /metrics and the console transport, on the real ASGI app."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.app.server import create_bot
from bot.kernel.errors import UsageError
from tests import store_reads
from tests.fakes.alerts import alert, body
from tests.fakes.bot import Harness, harness, settings
from tests.fakes.slack_api import FakeSlack


@pytest.fixture
async def h(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[Harness]:
    harness_ = harness(tmp_path, slack=slack)
    yield harness_
    await harness_.close()


def nothing_stored(h: Harness) -> bool:
    with h.bot.db.transaction() as s:
        return not store_reads.incidents(s) and not store_reads.audit_trail(s)


@pytest.mark.parametrize(
    ("token", "raw", "status", "reason"),
    [
        (None, body(), 401, "missing or wrong bearer token"),
        ("wrong", body(), 401, "missing or wrong bearer token"),
        ("am-secret-token-0123456789", b"{oops", 400, "body is not JSON"),
        (
            "am-secret-token-0123456789",
            body(version="3"),
            422,
            "not an Alertmanager webhook v4 payload: version",
        ),
        ("am-secret-token-0123456789", b"x" * (1 << 20 + 1), 413, "body over"),
    ],
)
async def test_webhook_refusals_store_nothing(
    h: Harness, slack: FakeSlack, token: str | None, raw: bytes, status: int, reason: str
) -> None:
    response = await h.webhook(raw, token=token)
    assert response.status_code == status
    assert reason in response.json()["error"]
    assert nothing_stored(h) and slack.calls == []


async def test_webhook_without_configured_token_is_refused(tmp_path: Path) -> None:
    h = harness(tmp_path, slack=None, alertmanager={})
    try:
        response = await h.webhook(body())
        assert (
            response.status_code == 503
            and "RULELOOP_ALERTMANAGER_TOKEN" in response.json()["error"]
        )
    finally:
        await h.close()


async def test_webhook_firing_duplicate_resolved_one_thread(h: Harness, slack: FakeSlack) -> None:
    first = await h.webhook(body(alert()))
    assert (first.status_code, first.json()["outcome"]) == (202, "opened")
    again = await h.webhook(body(alert()))  # Alertmanager retries before the diagnosis is done
    assert (again.status_code, again.json()) == (
        200,
        {
            "outcome": "duplicate",
            "incident": 1,
            "reason": "repeat of open incident 1; nothing changed",
        },
    )
    await slack.until("chat.update")
    await h.bot.tasks.drain()
    root = slack.of("chat.postMessage")[0]
    assert "VLLMTimeToFirstTokenP99High" in root.args["text"]
    resolved = await h.webhook(body(alert(status="resolved")))
    assert (resolved.status_code, resolved.json()["outcome"]) == (202, "resolved")
    await h.bot.tasks.drain()
    updates = slack.of("chat.update")
    assert len(updates) == 2 and {u.args["ts"] for u in updates} == {"1790000000.000001"}
    last = json.dumps(updates[-1].args["blocks"], ensure_ascii=False)
    assert ":white_check_mark: Resolved:" in last and "*TTFT p99*" in last  # numbers kept
    late = await h.webhook(body(alert()))  # a firing copy delivered after the resolution
    assert late.json()["outcome"] == "duplicate"
    await h.bot.tasks.drain()
    # root + findings + ADR note + Silence/Acknowledge buttons: one thread only
    assert len(slack.of("chat.postMessage")) == 4
    assert all(
        c.args.get("thread_ts") == "1790000000.000001" for c in slack.of("chat.postMessage")[1:]
    )


async def test_webhook_resolved_never_seen_firing_posts_resolved_root(
    h: Harness, slack: FakeSlack
) -> None:
    response = await h.webhook(body(alert(status="resolved")))
    assert response.json()["outcome"] == "resolved"
    await h.bot.tasks.drain()
    (root,) = slack.of("chat.postMessage")
    assert root.args["text"].startswith(":white_check_mark: Resolved: VLLMTimeToFirstTokenP99High")
    assert slack.of("chat.update") == []


async def test_webhook_unknown_target_says_how_to_fix(h: Harness, slack: FakeSlack) -> None:
    await h.webhook(body(alert(instance="10.9.9.9:8000")))
    await slack.until("chat.update")
    await h.bot.tasks.drain()
    _, reply, acknowledge = slack.of("chat.postMessage")  # the failure, then Acknowledge
    assert acknowledge.args["text"] == "Acknowledge"
    assert reply.args["text"].startswith(
        "Diagnosis failed: no configured target matches this alert"
    )
    assert "`ruleloop_target` label" in reply.args["text"] and "prod-a" in reply.args["text"]
    with h.bot.db.transaction() as s:
        assert store_reads.audit_trail(s)[-1].action == "diagnosis.failed"


async def test_healthz_and_metrics(h: Harness) -> None:
    health = await h.client.get("/healthz")
    assert health.json() == {"status": "ok", "transport": "slack", "background": 0,
                             "slack_messages": {"pending": 0, "failed": 0}}  # fmt: skip
    await h.webhook(body(alert()))
    await h.webhook(b"{", token="am-secret-token-0123456789")
    await h.bot.tasks.drain()
    text = (await h.client.get("/metrics")).text
    assert 'ruleloop_webhooks_total{outcome="opened"} 1.0' in text
    assert 'ruleloop_webhooks_total{outcome="rejected"} 1.0' in text
    assert 'ruleloop_diagnoses_total{outcome="posted"} 1.0' in text
    assert "ruleloop_diagnosis_post_seconds_count 1.0" in text


async def test_console_transport_prints_the_diagnosis(tmp_path: Path) -> None:
    h = harness(tmp_path, slack=None)
    try:
        assert (await h.client.get("/healthz")).json()["transport"] == "console"
        assert (await h.client.post("/slack/events", content=b"x")).status_code == 404
        await h.webhook(body(alert()))
        await h.bot.tasks.drain()
        await h.webhook(body(alert(status="resolved")))
        await h.bot.tasks.drain()
    finally:
        await h.close()
    out = h.console.getvalue()
    assert "[#incidents console.1] VLLMTimeToFirstTokenP99High | firing, diagnosing…" in out
    assert "    Goodput: 99.5 % (gate 95.0 %, ADR-20260831-01)" in out
    assert (
        "thread] chart (prod-a: TTFT p99 and queue depth): " in out
        and (tmp_path / "state" / "charts" / "incident-1-ttft-queue.png").exists()
    )
    assert "[#incidents console.1 updated] VLLMTimeToFirstTokenP99High | resolved" in out


def test_bad_runbook_fails_at_startup(tmp_path: Path) -> None:
    config = settings(tmp_path, slack=None)
    (config.paths.runbooks / "broken.yaml").write_text(
        "name: broken\nprobes: [{probe: gpu_magic}]\n"
    )
    with pytest.raises(UsageError, match="unknown probe 'gpu_magic'"):
        create_bot(config, state_dir=tmp_path / "state")


async def test_resolution_overtaking_the_diagnosis_is_not_painted_over(
    tmp_path: Path, slack: FakeSlack
) -> None:
    import asyncio

    import httpx

    from tests.fakes.bot import PAGES

    release = asyncio.Event()
    scrapes: list[str] = []

    async def engine(request: httpx.Request) -> httpx.Response:
        scrapes.append(request.url.path)
        if len(scrapes) == 2:
            await release.wait()  # the diagnosis is stuck mid-window
        return httpx.Response(200, text=PAGES[min(len(scrapes) - 1, 2)])

    h = harness(tmp_path, slack=slack, transport=httpx.MockTransport(engine))
    try:
        await h.webhook(body(alert()))
        await slack.until("chat.postMessage")  # root: diagnosing
        await h.webhook(body(alert(status="resolved")))
        (first,) = await slack.until("chat.update")
        assert first.args["text"].startswith(":white_check_mark: Resolved:")
        assert "diagnosing" in json.dumps(first.args["blocks"], ensure_ascii=False)
        release.set()
        await h.bot.tasks.drain()
        last = slack.of("chat.update")[-1]
        shown = json.dumps(last.args["blocks"], ensure_ascii=False)
        assert last.args["text"].startswith(":white_check_mark: Resolved:")  # still resolved
        assert "diagnosed" in shown and "*TTFT p99*" in shown
    finally:
        release.set()
        await h.close()
