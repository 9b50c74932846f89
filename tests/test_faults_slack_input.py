"""Faults in what reaches /slack/events (docs/reliability.md, issue 22), through the real bolt
app, signed requests and the fake Slack Web API: legacy payload types cannot change anything,
a malformed signed body is a 400 or a short ephemeral "could not read this request" (never a
500 or a traceback), `/adr-draft ²` is a usage error, and the "no such ADR" reply names no
path on the server."""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from bot.kernel.store.models import Remediation
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import FakeSlack, signed_headers

pytestmark = pytest.mark.faults

ADR = "ADR-20260831-01"
EVERYONE = {"diagnose": ["*"], "apply": ["*"], "approve": ["*"], "review": ["*"]}
UNREADABLE = "could not read this request"


@pytest.fixture
async def h(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[Harness]:
    slack.user_teams["U0EXT"] = "T0VENDOR"  # a Slack Connect member of the incident channel
    harness_ = harness(tmp_path, slack=slack, access=EVERYONE)
    yield harness_
    await harness_.close()


async def post_form(h: Harness, form: dict[str, str]) -> httpx.Response:
    body = urllib.parse.urlencode(form).encode()
    return await h.client.post("/slack/events", content=body, headers=signed_headers(body))


async def post_payload(h: Harness, payload: Any) -> httpx.Response:
    return await post_form(h, {"payload": json.dumps(payload)})


def states(h: Harness) -> list[str]:
    with h.bot.db.transaction() as s:
        return [r.state for r in s.scalars(select(Remediation)).all()]


async def card_buttons(h: Harness, slack: FakeSlack) -> dict[str, str]:
    from tests.test_remediation_slack import buttons

    await h.slash(f"{ADR} prod-a", user="U1", command="/apply-adr")
    card = (await slack.until("chat.postMessage", 2))[-1]
    return buttons(card)


def legacy(kind: str, callback_id: str, value: str, slack: FakeSlack) -> dict[str, Any]:
    """A legacy interaction (message attachment button, dialog) that names one of the bot's
    action ids as its callback_id: bolt's app.action() matches those too."""
    base = {"type": kind, "callback_id": callback_id, "user": {"id": "U0EXT"},
            "team": {"id": "T0FAKE"}, "channel": {"id": "C0INCIDENTS"}, "token": "legacy",
            "response_url": slack.response_url("legacy"), "action_ts": "1.2"}  # fmt: skip
    if kind == "interactive_message":
        return {**base, "actions": [{"name": "go", "type": "button", "value": value}]}
    return {**base, "submission": {"value": value}, "value": value, "state": value}


@pytest.mark.parametrize("kind", ["interactive_message", "dialog_submission"])
async def test_a_legacy_payload_from_an_external_user_cannot_approve(
    h: Harness, slack: FakeSlack, kind: str
) -> None:
    """Issue 22 item 3: a signed interactive_message whose callback_id is
    remediation_approve, from a Slack Connect user, approved the change (the guard looked
    only at actions[].action_id)."""
    approve = (await card_buttons(h, slack))["remediation_approve"]
    answered = await post_payload(h, legacy(kind, "remediation_approve", approve, slack))
    await h.bot.tasks.drain()
    assert states(h) == ["pending"]  # not approved, not run
    assert answered.status_code == 400
    assert answered.json()["error"].startswith(UNREADABLE)
    await h.click(approve, user="U2", action_id="remediation_approve")  # a colleague can
    await h.bot.tasks.drain()
    assert states(h) == ["dry_run"]


@pytest.mark.parametrize("callback_id", ["apply_adr", "adr_draft_accept"])
async def test_legacy_payloads_cannot_apply_or_review_either(
    h: Harness, slack: FakeSlack, callback_id: str
) -> None:
    value = json.dumps({"adr": ADR, "incident": 1, "target": "prod-a"})
    answered = await post_payload(h, legacy("interactive_message", callback_id, value, slack))
    await h.bot.tasks.drain()
    assert states(h) == [] and slack.of("chat.postMessage") == []
    assert answered.status_code == 400
    assert slack.of("response_url") == []


def test_the_guard_counts_a_legacy_callback_id_as_a_change() -> None:
    """What the listener will do decides, whatever the payload type."""
    from bot.surfaces.slack.workspace import changes_something

    for kind in ("interactive_message", "dialog_submission", "dialog_cancellation"):
        assert changes_something({"type": kind, "callback_id": "remediation_approve"})
    assert changes_something({"type": "block_actions", "actions": [{"action_id": "apply_adr"}]})
    assert not changes_something({"command": "/diagnose"})


def well_formed_click(slack: FakeSlack, **changes: Any) -> dict[str, Any]:
    payload = {"type": "block_actions", "user": {"id": "U1"}, "team": {"id": "T0FAKE"},
               "api_app_id": "A0", "trigger_id": "1.2.3", "response_url": slack.response_url("b"),
               "channel": {"id": "C0INCIDENTS"}, "container": {"type": "message"},
               "actions": [{"type": "button", "action_id": "remediation_approve",
                            "block_id": "b", "value": "tok", "action_ts": "1"}]}  # fmt: skip
    payload.update(changes)
    return payload


MALFORMED_BODIES: list[tuple[str, bytes, str]] = [
    ("payload not JSON", b"payload=%7Bnot+json", "application/x-www-form-urlencoded"),
    ("payload a list", b"payload=%5B1%2C2%5D", "application/x-www-form-urlencoded"),
    ("JSON not an object", b"[1, 2, 3]", "application/json"),
    ("JSON broken", b'{"type": "event_callback", ', "application/json"),
    ("authorizations a string", b"authorizations=x&user=U1", "text/plain"),
    ("form with no command", b"user_id=U1&text=hi", "application/x-www-form-urlencoded"),
    (
        "event with a string team",
        b'{"type":"event_callback","event":{"type":"x"},'
        b'"is_ext_shared_channel":true,"enterprise":3}',
        "application/json",
    ),  # fmt: skip
    # Issue 31 item 8: a RecursionError (500) from 1,000 deep on; item 9: 401, not 400
    ("JSON 1,000 deep", b'{"a":' * 1000 + b"1" + b"}" * 1000, "application/json"),
    ("JSON 5,000 deep", b"[" * 5000 + b"]" * 5000, "application/json"),
    (
        "payload 5,000 deep",
        b"payload=" + b"%5B" * 5000 + b"%5D" * 5000,
        "application/x-www-form-urlencoded",
    ),  # fmt: skip
    ("form not UTF-8", b"command=%2Fdiagnose&user_id=U1&text=\xff\xfe", "text/plain"),
    ("JSON not UTF-8", b'{"type": "block_actions", "x": "\xc3\x28"}', "application/json"),
]


@pytest.mark.parametrize(
    ("why", "raw", "ctype"), MALFORMED_BODIES, ids=[m[0] for m in MALFORMED_BODIES]
)
async def test_a_malformed_signed_body_is_a_400_not_a_500(
    h: Harness, slack: FakeSlack, caplog: pytest.LogCaptureFixture, why: str, raw: bytes, ctype: str
) -> None:
    """Issue 22 item 4: bolt's parsing ran outside any guard: a 500 and a traceback."""
    with caplog.at_level(logging.INFO):
        answered = await h.client.post(
            "/slack/events", content=raw, headers={**signed_headers(raw), "Content-Type": ctype}
        )
        await h.bot.tasks.drain()
    assert answered.status_code == 400, answered.text
    assert answered.json()["error"].startswith(UNREADABLE)
    assert [r for r in caplog.records if r.exc_info] == []
    metrics = (await h.client.get("/metrics")).text
    assert 'ruleloop_slack_requests_total{verdict="malformed"} 1.0' in metrics


MALFORMED_CLICKS: list[tuple[str, dict[str, Any]]] = [
    ("user a string", {"user": "U1"}),
    ("user without id", {"user": {"name": "x"}}),
    ("no actions", {"actions": []}),
    ("action without value", {"actions": [{"action_id": "remediation_approve"}]}),
    ("actions not a list", {"actions": 7}),
    ("team a list", {"team": [1]}),
    ("channel a number", {"channel": 5}),
    ("response_url not a URL", {"response_url": "not a url"}),
    ("response_urls a number", {"response_urls": 3}),
]


@pytest.mark.parametrize(("why", "changes"), MALFORMED_CLICKS, ids=[m[0] for m in MALFORMED_CLICKS])
async def test_a_malformed_signed_click_is_a_400(
    h: Harness,
    slack: FakeSlack,
    caplog: pytest.LogCaptureFixture,
    why: str,
    changes: dict[str, Any],
) -> None:
    with caplog.at_level(logging.INFO):
        answered = await post_payload(h, well_formed_click(slack, **changes))
        await h.bot.tasks.drain()
    assert answered.status_code == 400, answered.text
    assert answered.json()["error"].startswith(UNREADABLE)
    assert [r for r in caplog.records if r.exc_info] == []


@pytest.mark.parametrize("drop", ["user_id", "channel_id", "response_url"], ids=lambda d: f"no {d}")
@pytest.mark.parametrize("command", ["/diagnose", "/apply-adr", "/adr-draft"])
async def test_a_slash_command_missing_a_field_gets_a_short_ephemeral_answer(
    h: Harness, slack: FakeSlack, caplog: pytest.LogCaptureFixture, command: str, drop: str
) -> None:
    form = {"command": command, "text": f"{ADR} prod-a" if command == "/apply-adr" else "",
            "user_id": "U1", "channel_id": "C0INCIDENTS", "team_id": "T0FAKE",
            "response_url": slack.response_url("cmd"), "trigger_id": "1.2.3"}  # fmt: skip
    del form[drop]
    with caplog.at_level(logging.INFO):
        answered = await post_form(h, form)
        await h.bot.tasks.drain()
    assert answered.status_code == 200
    reply = answered.json()
    assert reply["response_type"] == "ephemeral"
    assert reply["text"].startswith(UNREADABLE) and len(reply["text"]) < 200
    assert [r for r in caplog.records if r.exc_info] == []
    assert slack.of("chat.postMessage") == []


@pytest.mark.parametrize("text", ["²", "#²", "١٢", "１"])
async def test_adr_draft_with_a_digit_that_is_not_0_to_9_says_how(
    h: Harness, slack: FakeSlack, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    """Issue 22 item 7: `²` passes isdigit() but not int(): "unexpected error"."""
    with caplog.at_level(logging.INFO):
        await h.slash(text, command="/adr-draft")
        (reply,) = await slack.until("response_url")
        await h.bot.tasks.drain()
    assert reply.args["text"] == "Usage: /adr-draft [incident-id] (default: the newest incident)"
    assert [r for r in caplog.records if r.exc_info] == []


async def test_no_such_adr_names_no_path_on_the_server(
    h: Harness, slack: FakeSlack, tmp_path: Path
) -> None:
    """Issue 22 item 7: the reply showed the server's ADR directory to the Slack user."""
    await h.slash("ADR-20990101-01 prod-a", command="/apply-adr")
    (reply,) = await slack.until("response_url")
    text = reply.args["text"]
    assert str(tmp_path) not in text and "/adr" not in text.replace("/apply-adr", "")
    assert text == (
        f"no ADR ADR-20990101-01 (known: {ADR}); `ruleloop adr list` on the bot's host lists them."
    )


@pytest.mark.parametrize("incident", ["1e999", "99999999999999999999", "true", '"1"'])
async def test_an_apply_button_with_an_impossible_incident_id_says_so(
    h: Harness, slack: FakeSlack, caplog: pytest.LogCaptureFixture, incident: str
) -> None:
    """int(1e999) raised OverflowError, and a 20-digit id overflowed SQLite: "unexpected"."""
    with caplog.at_level(logging.INFO):
        await h.click(f'{{"adr": "{ADR}", "incident": {incident}}}')
        (reply,) = await slack.until("response_url")
        await h.bot.tasks.drain()
    assert reply.args["text"] == "this button carries no ADR; it may be from an older bot version"
    assert [r for r in caplog.records if r.exc_info] == []


async def test_over_socket_mode_a_legacy_payload_cannot_approve_either(
    h: Harness, slack: FakeSlack
) -> None:
    """No HTTP route reads a Socket Mode request first: the app's own first middleware does."""
    from slack_bolt.adapter.socket_mode.async_internals import run_async_bolt_app
    from slack_sdk.socket_mode.request import SocketModeRequest

    approve = (await card_buttons(h, slack))["remediation_approve"]
    assert h.bot.slack is not None
    payload = legacy("interactive_message", "remediation_approve", approve, slack)
    envelope = SocketModeRequest(type="interactive", envelope_id="e-2", payload=payload)
    answered = await run_async_bolt_app(h.bot.slack, envelope)
    await h.bot.tasks.drain()
    assert states(h) == ["pending"]
    assert answered.status == 400 and UNREADABLE in str(answered.body)


async def test_slacks_ssl_check_is_still_answered(h: Harness) -> None:
    answered = await post_form(h, {"ssl_check": "1", "token": "legacy"})
    assert (answered.status_code, answered.text) == (200, "")


async def test_an_apply_button_of_an_incident_that_is_gone_says_so(
    h: Harness, slack: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by the fuzz: an Apply button naming its target and an incident the store no longer
    has (retention, a reset store) hit an assert: "unexpected error" and a traceback."""
    with caplog.at_level(logging.INFO):
        await h.click(json.dumps({"adr": ADR, "incident": 999, "target": "prod-a"}))
        (reply,) = await slack.until("response_url")
        await h.bot.tasks.drain()
    assert reply.args["text"] == "there is no incident 999"
    assert [r for r in caplog.records if r.exc_info] == [] and states(h) == []
