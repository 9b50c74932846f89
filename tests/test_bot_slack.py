"""The real bolt app behind /slack/events, against the fake Slack Web API, with signed requests."""

from __future__ import annotations

import hmac
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.kernel.errors import UsageError
from bot.surfaces.slack import shapes
from bot.surfaces.slack.errors import error_text
from tests import store_reads
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import SIGNING_SECRET, FakeSlack, signed_headers


@pytest.fixture
async def h(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[Harness]:
    harness_ = harness(tmp_path, slack=slack, matching_adr=True)
    yield harness_
    await harness_.close()


def texts(blocks: list[dict]) -> str:
    return json.dumps(blocks, ensure_ascii=False)


async def test_diagnose_posts_one_thread_with_numbers_chart_and_adr(
    h: Harness, slack: FakeSlack
) -> None:
    response = await h.slash("prod-a")
    assert response.status_code == 200
    assert response.text == "Diagnosing *prod-a*: the result will be posted in this channel."
    await slack.until("chat.update")
    await h.bot.tasks.drain()
    root, findings, adrs = slack.of("chat.postMessage")
    assert root.args["channel"] == "C0INCIDENTS" and "thread_ts" not in root.args
    root_ts = slack.messages[("C0INCIDENTS", "1790000000.000001")]["ts"]
    assert findings.args["thread_ts"] == adrs.args["thread_ts"] == root_ts
    # the four numbers from the recorded engine pages, against the seed ADR's gates
    (update,) = slack.of("chat.update")
    shown = texts(update.args["blocks"])
    assert "*Goodput*\\n99.5 % :white_check_mark:  (gate ≥ 95.0 %, ADR-20260831-01)" in shown
    assert "*TTFT p99*" in shown and "gate ≤ 350 ms" in shown and "diagnosed" in shown
    assert "TTFT p99" in texts(findings.args["blocks"]) and ":red_circle:" in texts(
        findings.args["blocks"]
    )
    assert "no GPU visible" in texts(findings.args["blocks"])
    # the chart: files upload v2 into the thread
    (url,) = slack.of("files.getUploadURLExternal")
    (upload,) = slack.of("upload")
    (complete,) = slack.of("files.completeUploadExternal")
    assert upload.body.startswith(b"\x89PNG") and int(url.args["length"]) == len(upload.body)
    assert complete.args["thread_ts"] == root_ts and complete.args["channel_id"] == "C0INCIDENTS"
    # the matching ADR with its Apply button
    button = adrs.args["blocks"][1]["accessory"]
    assert button["action_id"] == "apply_adr"
    assert json.loads(button["value"]) == {
        "adr": "ADR-20260831-01",
        "incident": 1,
        "target": "prod-a",
    }
    with h.bot.db.transaction() as s:
        (incident,) = store_reads.incidents(s)
        assert incident.status == "resolved" and incident.source == "slash"
        actions = [e.action for e in store_reads.audit_trail(s)]
    assert actions == [
        "diagnose.requested",
        "slack.root_posted",
        "diagnosis.finished",
        "diagnosis.posted",
        "diagnosis.chart_posted",
    ]


@pytest.mark.parametrize(
    ("user", "text", "answer"),
    [
        ("U9", "prod-a", "You may not run /diagnose. Allowed: <@U1>."),
        ("U1", "nope", "unknown target 'nope'; known targets: prod-a"),
        ("U1", "a b", "Usage: /diagnose [target]. Known targets: prod-a"),
        # a 100 KB argument was echoed whole
        pytest.param(
            "U1",
            "x" * 100_000,
            f"unknown target '{'x' * 64}'… (100,000 characters); known targets: prod-a",
            id="100KB-argument",
        ),
    ],
)
async def test_diagnose_refusals_are_ephemeral(
    h: Harness, slack: FakeSlack, user: str, text: str, answer: str
) -> None:
    response = await h.slash(text, user=user)
    assert response.status_code == 200
    (reply,) = await slack.until("response_url")
    assert (reply.args["text"], reply.args["response_type"]) == (answer, "ephemeral")
    await h.bot.tasks.drain()
    assert slack.of("chat.postMessage") == []


async def test_unsigned_bad_stale_and_replayed_requests_are_refused(
    h: Harness, slack: FakeSlack
) -> None:
    body = b"command=%2Fdiagnose&text=prod-a&user_id=U1&channel_id=C0INCIDENTS"
    cases = [
        {},
        {**signed_headers(body), "X-Slack-Signature": "v0=" + "0" * 64},
        signed_headers(body, secret="another-secret"),
        signed_headers(body, timestamp=int(time.time()) - 600),
        {**signed_headers(body), "X-Slack-Request-Timestamp": "not-a-number"},
    ]
    for headers in cases:
        response = await h.client.post("/slack/events", content=body, headers=headers)
        assert response.status_code == 401, headers
        assert "signature" in response.json()["error"]
    headers = signed_headers(b"command=%2Fdiagnose&text=nope&user_id=U1&channel_id=C0&response_url=" +
                             slack.response_url().encode())  # fmt: skip
    replay_body = (
        b"command=%2Fdiagnose&text=nope&user_id=U1&channel_id=C0&response_url="
        + slack.response_url().encode()
    )
    first = await h.client.post(
        "/slack/events", content=replay_body, headers=headers
    )  # refused: nope
    again = await h.client.post("/slack/events", content=replay_body, headers=headers)
    assert first.status_code == 200
    assert (again.status_code, again.json()["error"]) == (
        401,
        "this signed request was already received (replay)",
    )
    await h.bot.tasks.drain()
    assert len(slack.of("response_url")) == 1  # only the first one was handled
    assert slack.of("chat.postMessage") == []


async def test_a_signed_request_is_verified_once(
    h: Harness, slack: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route checks the signature before its replay guard; bolt checked it again (issue
    32). Counted: HMACs keyed with the signing secret while the request is served."""
    body = b"command=%2Fdiagnose&text=nope&user_id=U1&channel_id=C0&response_url=" + (
        slack.response_url().encode()
    )
    headers = signed_headers(body)
    keyed, new = [], hmac.new

    def counted(key: bytes, msg: bytes | None = None, digestmod: Any = None) -> hmac.HMAC:
        if key == SIGNING_SECRET.encode():
            keyed.append(msg)
        return new(key, msg, digestmod)

    monkeypatch.setattr(hmac, "new", counted)
    response = await h.client.post("/slack/events", content=body, headers=headers)
    assert response.status_code == 200
    await slack.until("response_url")  # bolt ran the listener: the request went all the way
    assert len(keyed) == 1


async def test_a_request_body_is_checked_once(
    h: Harness, slack: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route checks a request's fields on its bytes before bolt; bolt's middleware checked
    them again (issue 32), and now checks only Socket Mode's. Made to fail by checking HTTP
    requests in the middleware again (2 checks)."""
    checked: list[Any] = []
    check = shapes.check

    def counted(body: Any) -> None:
        checked.append(body)
        check(body)

    monkeypatch.setattr(shapes, "check", counted)
    response = await h.slash("nope")
    assert response.status_code == 200
    await slack.until("response_url")  # bolt ran the listener: the request went all the way
    assert len(checked) == 1


async def _diagnosed(h: Harness, slack: FakeSlack) -> str:
    await h.slash("prod-a")
    await slack.until("chat.update")
    await h.bot.tasks.drain()
    return slack.of("chat.postMessage")[-1].args["blocks"][1]["accessory"]["value"]


async def test_apply_button_posts_the_confirmation_card(h: Harness, slack: FakeSlack) -> None:
    value = await _diagnosed(h, slack)
    root_ts = slack.of("chat.postMessage")[0].args.get("ts") or "1790000000.000001"
    assert (await h.click(value)).status_code == 200
    card = (await slack.until("chat.postMessage", 4))[-1]
    assert card.args["thread_ts"] == root_ts
    assert card.args["text"] == "ADR-20260831-01 on prod-a: waiting for approval"
    blocks = json.dumps(card.args["blocks"], ensure_ascii=False)
    assert "--block-size: (unset) \u2192 32" in blocks and "TTFT p99 \u2264 350 ms" in blocks
    with h.bot.db.transaction() as s:
        entry = store_reads.audit_trail(s)[-1]
    assert (entry.action, entry.actor, entry.detail["adr"]) == (
        "remediation.requested",
        "U1",
        "ADR-20260831-01",
    )


async def test_apply_button_refuses_who_may_not(h: Harness, slack: FakeSlack) -> None:
    value = await _diagnosed(h, slack)
    await h.click(value, user="U9")
    reply = [c for c in await slack.until("response_url", 1) if c.args["name"] == "btn"][0]
    assert reply.args["text"] == (
        "You may not request ADR changes. Allowed: <@U1>. Nothing was changed."
    )
    assert reply.args["response_type"] == "ephemeral" and reply.args["replace_original"] is False
    assert len(slack.of("chat.postMessage")) == 3  # nothing new in the thread


async def test_unexpected_error_shows_an_id_not_a_trace(
    h: Harness, slack: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    from sqlalchemy import text

    with h.bot.db.engine.begin() as connection:  # a store without its tokens: a bug, not advice
        connection.execute(text("DROP TABLE action_tokens"))
    await h.click("a-token", action_id="remediation_approve")
    (reply,) = await slack.until("response_url")
    match = re.fullmatch(
        r"Something went wrong on the bot's side \(error id `([0-9a-f]{8})`\)\. .*",
        reply.args["text"],
    )
    assert match is not None and "Traceback" not in reply.args["text"]
    assert match[1] in caplog.text and "OperationalError" in caplog.text


async def test_slack_429_is_retried(h: Harness, slack: FakeSlack) -> None:
    slack.rate_limit("chat.postMessage", times=1, retry_after=0)
    await h.slash("prod-a")
    await slack.until("chat.update")
    await h.bot.tasks.drain()
    statuses = [c.status for c in slack.calls if c.method == "chat.postMessage"]
    assert statuses == [429, 200, 200, 200]


def test_error_text_known_and_unknown(caplog: pytest.LogCaptureFixture) -> None:
    assert error_text(UsageError("try prod-b")) == "try prod-b"
    text = error_text(KeyError("secret internals"))
    assert "secret internals" not in text and re.search(r"`[0-9a-f]{8}`", text)
