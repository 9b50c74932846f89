"""Faults at the Slack side (docs/reliability.md), through the real bolt app, signed requests and
the fake Slack Web API: untrusted text never becomes a live mention or link, one huge finding
does not sink a diagnosis, uploads reach channels the bot has not joined."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.kernel.chat import mrkdwn
from bot.kernel.chat.messages import IncidentView
from bot.surfaces.slack.views import root_message
from tests.fakes.alerts import alert, body
from tests.fakes.bot import RUNBOOK, Harness, harness
from tests.fakes.slack_api import FakeSlack

pytestmark = pytest.mark.faults

EVIL = "<!channel> <https://x|Re-authenticate>"
# What Slack would render live: a broadcast or special mention, a user, a channel, a link.
LIVE = re.compile(r"<(?:[!#]|@(?!U[12]>)|https?:|mailto:)", re.IGNORECASE)


def rendered(value: Any) -> Iterator[str]:
    """Every string Slack parses as mrkdwn in a message: its fallback text and its mrkdwn
    text objects (plain_text objects, such as headers, are shown as they are)."""
    if isinstance(value, dict):
        if value.get("type") == "plain_text":
            return
        for key, item in value.items():
            if key == "text" and isinstance(item, str):
                yield item
            elif key != "value":  # a button's value is data, never shown
                yield from rendered(item)
    elif isinstance(value, list):
        for item in value:
            yield from rendered(item)


def live_markup(slack: FakeSlack) -> list[str]:
    """The rendered strings of every message the fake Slack received that hold live markup."""
    shown = [
        text
        for call in slack.calls
        if call.method in ("chat.postMessage", "chat.update", "response_url")
        for text in rendered({"text": call.args.get("text"), "blocks": call.args.get("blocks")})
    ]
    assert shown, "no message was sent"
    return [text for text in shown if LIVE.search(text)]


@pytest.fixture
async def h(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[Harness]:
    harness_ = harness(tmp_path, slack=slack, matching_adr=True)
    yield harness_
    await harness_.close()


async def test_alert_labels_never_become_a_live_mention_or_link(
    h: Harness, slack: FakeSlack
) -> None:
    """Item 5: the label came out as a live @channel and a disguised link (root, thread)."""
    evil = alert(instance=EVIL, team=EVIL)
    sent = body(evil, groupLabels={"alertname": "VLLMTimeToFirstTokenP99High", "instance": EVIL})
    assert (await h.webhook(sent)).status_code == 202
    await slack.until("chat.update")
    await h.bot.tasks.drain()
    assert live_markup(slack) == []
    shown = json.dumps([c.args for c in slack.calls], ensure_ascii=False)
    assert "&lt;!channel&gt; &lt;https://x|Re-authenticate&gt;" in shown  # shown, as text


async def test_adr_text_never_becomes_live_markup_in_the_thread_or_the_card(
    h: Harness, slack: FakeSlack, tmp_path: Path
) -> None:
    """ADR titles reach the matching-ADR message and, after Apply, the remediation card."""
    seed = next((tmp_path / "adr").glob("ADR-20260831-01-*.md"))
    text = seed.read_text()
    title = re.search(r"^title: (.*)$", text, re.M)
    assert title is not None
    text = text.replace(f": {title[1]}\n", f": {EVIL} {title[1]}\n")  # the heading too
    seed.write_text(text.replace(title[0], f"title: '{EVIL} {title[1]}'"))
    await h.slash("prod-a")
    await slack.until("chat.update")
    await h.bot.tasks.drain()
    adrs = slack.of("chat.postMessage")[2]
    button = adrs.args["blocks"][1]["accessory"]
    assert button["action_id"] == "apply_adr"
    await h.click(button["value"])
    (*_, card) = await slack.until("chat.postMessage", 4)
    await h.bot.tasks.drain()
    assert live_markup(slack) == []
    assert "&lt;!channel&gt;" in json.dumps(card.args["blocks"], ensure_ascii=False)


async def test_one_huge_finding_line_is_clipped_and_the_diagnosis_posted(
    tmp_path: Path, slack: FakeSlack
) -> None:
    """Item 13: a 3,500-character finding made the findings unpostable (over 3,000 per text)."""
    runbooks = tmp_path / "long-runbooks"
    runbooks.mkdir()
    (runbooks / "long.yaml").write_text(
        RUNBOOK.replace('message: "goodput {value:.1%}"', f'message: "{"x" * 3500} {{value:.1%}}"')
    )
    paths = {"runbooks": str(runbooks), "adr": str(tmp_path / "adr")}
    h = harness(tmp_path, slack=slack, paths=paths)
    try:
        await h.slash("prod-a")
        await slack.until("chat.update")
        await h.bot.tasks.drain()
        findings = slack.of("chat.postMessage")[1]
        sections = [b["text"]["text"] for b in findings.args["blocks"]]
        lines = [line for s in sections for line in s.splitlines()]
        assert any(ln.startswith(":information_source: xxxx") and ln.endswith("…") for ln in lines)
        assert all(len(s) <= 3000 for s in sections)
        assert "TTFT p99" in json.dumps(sections)  # the other findings are there too
    finally:
        await h.close()


SPECIAL = st.sampled_from(["<", ">", "&", "!", "@", "#", "|", "^", "http://", "channel", "U1"])
LABELS = st.lists(st.one_of(SPECIAL, st.text(max_size=8)), max_size=20).map("".join)


@given(LABELS)
def test_no_label_text_survives_escaping_as_markup(label: str) -> None:
    """Item 5 (property): whatever the text, escaped it opens no mention, link or broadcast."""
    escaped = mrkdwn.escape(label)
    assert "<" not in escaped and ">" not in escaped
    assert mrkdwn.unescape(escaped) == label
    kept = mrkdwn.escape_keeping(label, ["U1"])
    assert not LIVE.search(kept.replace("<@U1>", ""))
    clipped = mrkdwn.clip(escaped, 20)
    assert len(clipped) <= 20 and not re.search(r"&[a-z]*$", clipped.removesuffix("…"))


@given(LABELS)
def test_no_label_text_makes_the_root_message_live(label: str) -> None:
    import datetime as dt

    view = IncidentView(
        id=1, title=f"VLLMTimeToFirstTokenP99High (instance={label})", status="firing",
        source="alertmanager", target=label or None, opened_at=dt.datetime(2026, 9, 1, tzinfo=dt.UTC),
        closed_at=None, state="failed", summary={"runbook": label},
    )  # fmt: skip
    text, blocks = root_message(view)
    assert [s for s in rendered({"text": text, "blocks": blocks}) if LIVE.search(s)] == []


@given(st.lists(st.tuples(LABELS, st.integers(0, 4000)), min_size=1, max_size=20))
def test_no_finding_text_makes_the_findings_live_or_too_long(
    texts: list[tuple[str, int]],
) -> None:
    """Error bodies reach findings: escaped, and clipped so every section stays postable."""
    import datetime as dt

    from bot.diagnosis.models import Baseline, Diagnosis
    from bot.diagnosis.probes.types import Finding, Severity
    from bot.kernel.numbers import Measured
    from bot.surfaces.slack.views import findings_message

    findings = [Finding(Severity.WARNING, text + "<" * pad, "probe") for text, pad in texts]
    diagnosis = Diagnosis(
        target="prod-a", runbook="r", headline=Measured(), baseline=Baseline(), findings=findings,
        matches=[], readings=Measured(), details={}, sampling_s=1.0, at=dt.datetime(2026, 9, 1, tzinfo=dt.UTC),
    )  # fmt: skip
    text, blocks = findings_message(diagnosis)
    shown = list(rendered({"text": text, "blocks": blocks}))
    assert [s for s in shown if LIVE.search(s)] == []
    assert all(0 < len(s) <= 3000 for s in shown)


async def test_a_pinned_workspace_refuses_requests_from_another_team(
    tmp_path: Path, slack: FakeSlack
) -> None:
    """Item 8: a signed /diagnose with another team_id was accepted."""
    h = harness(tmp_path, slack=slack, slack_extra={"team_id": "T0FAKE"})
    try:
        assert (await h.slash("prod-a", team="T0EVIL")).status_code == 200
        (reply,) = await slack.until("response_url")
        assert reply.args["response_type"] == "ephemeral"
        assert reply.args["text"] == (
            "This bot serves the Slack workspace T0FAKE only; this request came from T0EVIL. "
            "Nothing was done."
        )
        await h.bot.tasks.drain()
        assert slack.of("chat.postMessage") == []
        assert (await h.slash("prod-a")).status_code == 200  # its own workspace: served
        await slack.until("chat.update")
    finally:
        await h.close()


async def test_a_pinned_enterprise_refuses_requests_from_another_org(
    tmp_path: Path, slack: FakeSlack
) -> None:
    h = harness(tmp_path, slack=slack, slack_extra={"enterprise_id": "E0OURS"})
    try:
        await h.slash("prod-a")  # no enterprise in the request: not ours
        (reply,) = await slack.until("response_url")
        assert reply.args["text"].startswith("This bot serves the Slack Enterprise Grid org E0OURS")
        assert slack.of("chat.postMessage") == []
    finally:
        await h.close()


EVERYONE = {"diagnose": ["*"], "apply": ["*"], "approve": ["*"], "review": ["*"]}


async def test_external_users_may_not_apply_approve_or_review_even_with_star(
    tmp_path: Path, slack: FakeSlack
) -> None:
    """Item 8: with access "*", Slack Connect users of another organisation could approve."""
    slack.user_teams["U0EXT"] = "T0VENDOR"
    h = harness(tmp_path, slack=slack, access=EVERYONE)
    try:
        from tests.test_remediation_slack import buttons

        await h.slash("ADR-20260831-01 prod-a", user="U0EXT", command="/apply-adr")
        (refused,) = await slack.until("response_url")
        assert refused.args["text"] == (
            "You are not a member of this workspace (your home workspace is T0VENDOR): people "
            "from other organisations (Slack Connect) may not apply, approve or review changes "
            "here. Nothing was changed."
        )
        await h.slash("ADR-20260831-01 prod-a", user="U1", command="/apply-adr")
        card = (await slack.until("chat.postMessage", 2))[-1]
        approve = buttons(card)["remediation_approve"]
        # the clicker's home team as Slack sends it in the payload, then as users.info says
        await h.click(approve, user="U0EXT2", user_team="T0VENDOR", action_id="remediation_approve")
        await h.click(approve, user="U0EXT", action_id="remediation_approve")
        await h.click("any-draft", user="U0EXT", action_id="adr_draft_accept")  # review
        answers = [a for a in await slack.until("response_url", 5) if a.args["name"] == "btn"]
        assert len(answers) == 3 and all("Slack Connect" in a.args["text"] for a in answers)
        with h.bot.db.transaction() as s:
            from bot.kernel.store.models import Remediation

            (rem,) = s.query(Remediation).all()
            assert rem.state == "pending"
        await h.click(approve, user="U2", action_id="remediation_approve")  # a colleague can
        await h.bot.tasks.drain()
        with h.bot.db.transaction() as s:
            assert s.query(Remediation).one().state == "dry_run"
        assert (await h.slash("prod-a", user="U0EXT")).status_code == 200  # diagnose: allowed
        await slack.until("chat.update")
    finally:
        await h.close()


async def test_the_chart_reaches_a_public_channel_the_bot_had_not_joined(
    h: Harness, slack: FakeSlack
) -> None:
    """Item 20: files upload v2 needs membership (chat:write.public does not give it)."""
    slack.joined.clear()
    await h.slash("prod-a")
    await slack.until("files.completeUploadExternal")
    await h.bot.tasks.drain()
    (joined,) = slack.of("conversations.join")
    assert joined.args["channel"] == "C0INCIDENTS"
    refused = [
        c for c in slack.calls if c.method == "files.completeUploadExternal" and c.status != 200
    ]
    assert len(refused) == 1  # not_in_channel once, then joined and uploaded
    await h.slash("", command="/adr-draft")  # the draft's file: now a member, no second join
    await slack.until("files.completeUploadExternal", 2)
    assert len(slack.of("conversations.join")) == 1


async def test_a_private_channel_the_bot_is_not_in_says_what_to_do(
    h: Harness, slack: FakeSlack
) -> None:
    slack.joined.clear()
    slack.private.add("C0INCIDENTS")
    await h.slash("prod-a")
    await slack.until("chat.update")
    await h.bot.tasks.drain()
    last = slack.of("chat.postMessage")[-1].args["text"]
    assert last == (
        "The chart could not be posted: the bot is not a member of channel C0INCIDENTS and "
        "cannot join it (method_not_supported_for_channel_type): invite it with "
        "`/invite @ruleloop` (a private channel), or give the app the channels:join scope."
    )


async def test_a_request_replayed_to_another_replica_is_refused(
    tmp_path: Path, slack: FakeSlack
) -> None:
    """Item 18: the replay guard was per process; two replicas on one store share it now."""
    import urllib.parse

    from tests.fakes.slack_api import signed_headers

    first, second = harness(tmp_path, slack=slack), harness(tmp_path, slack=slack)
    try:
        form = {"command": "/diagnose", "text": "nope", "user_id": "U1", "team_id": "T0FAKE",
                "channel_id": "C0INCIDENTS", "response_url": slack.response_url("cmd")}  # fmt: skip
        request = urllib.parse.urlencode(form).encode()
        headers = signed_headers(request)
        answered = await first.client.post("/slack/events", content=request, headers=headers)
        assert answered.status_code == 200
        replayed = await second.client.post("/slack/events", content=request, headers=headers)
        assert replayed.status_code == 401
        assert replayed.json()["error"] == "this signed request was already received (replay)"
        assert len(await slack.until("response_url")) == 1  # answered once, by the first
    finally:
        await first.close()
        await second.close()


async def test_apply_adr_is_acked_before_any_slack_call_and_a_retry_makes_no_second_card(
    tmp_path: Path, slack: FakeSlack
) -> None:
    """Item 9: acked after the work (4.6 s under one 429 with Retry-After 4, past Slack's
    3 s); Slack's retry of the delivery then made a second card."""
    import time

    import httpx
    from sqlalchemy import select

    from bot.kernel.store.models import Remediation
    from tests.fakes.slack_api import signed_headers

    slack.rate_limit("chat.postMessage", times=1, retry_after=4)
    h = harness(tmp_path, slack=slack)
    answered: list[tuple[float, list[str]]] = []  # when the bot answered, and Slack's calls then

    async def app(scope: Any, receive: Any, send: Any) -> None:
        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                answered.append((time.time(), [c.method for c in slack.calls]))
            await send(message)

        await h.bot.app(scope, receive, sending)

    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bot")
    try:
        request = h.slash_body("ADR-20260831-01 prod-a", command="/apply-adr")
        signed_at = int(time.time())
        first = await client.post("/slack/events", content=request,
                                  headers=signed_headers(request, timestamp=signed_at))  # fmt: skip
        ((first_at, before_first),) = answered
        assert before_first == []  # not one Slack call before the ack
        assert (first.status_code, first.text) == (200, "")
        # Slack delivers it again (its timeout, or a lost answer): signed anew, the same body
        retry = {**signed_headers(request, timestamp=signed_at + 1),
                 "X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}  # fmt: skip
        again = await client.post("/slack/events", content=request, headers=retry)
        assert (again.status_code, again.text) == (200, "")
        (answer,) = await slack.until("response_url")
        await h.bot.tasks.drain()
        web_api = [c for c in slack.calls if c.method != "response_url"]
        assert min(c.at for c in web_api) >= first_at  # every one came after it
        assert [c.status for c in web_api if c.method == "chat.postMessage"] == [429, 200, 200]
        root, card = slack.of("chat.postMessage")  # the thread, and exactly one card
        assert card.args["thread_ts"] and "remediation_approve" in str(card.args["blocks"])
        assert answer.args["text"].startswith(
            "ADR-20260831-01 on prod-a: the confirmation card is in the incident thread"
        )
        assert len(slack.of("response_url")) == 1  # the retry was acknowledged, not handled
        with h.bot.db.transaction() as s:
            assert len(s.scalars(select(Remediation)).all()) == 1
        metrics = (await h.client.get("/metrics")).text
        assert 'ruleloop_slack_requests_total{verdict="retried"} 1.0' in metrics
    finally:
        await client.aclose()
        await h.close()


async def test_over_socket_mode_apply_adr_is_acked_before_any_slack_call(
    tmp_path: Path, slack: FakeSlack
) -> None:
    """Item 9 over Socket Mode: bolt's own Socket Mode adapter dispatches the envelope; its
    answer (the ack sent back on the socket) comes before the bot calls Slack."""
    from slack_bolt.adapter.socket_mode.async_internals import run_async_bolt_app
    from slack_sdk.socket_mode.request import SocketModeRequest

    slack.rate_limit("chat.postMessage", times=1, retry_after=4)
    h = harness(tmp_path, slack=slack)
    try:
        assert h.bot.slack is not None
        payload = {"command": "/apply-adr", "text": "ADR-20260831-01 prod-a", "user_id": "U1",
                   "channel_id": "C0INCIDENTS", "team_id": "T0FAKE", "trigger_id": "9.9.9",
                   "response_url": slack.response_url("socket")}  # fmt: skip
        envelope = SocketModeRequest(type="slash_commands", envelope_id="e-1", payload=payload)
        acked = await run_async_bolt_app(h.bot.slack, envelope)
        assert acked.status == 200 and slack.calls == []  # the ack, before any Slack call
        (answer,) = await slack.until("response_url")
        assert "the confirmation card is in the incident thread" in answer.args["text"]
        await h.bot.tasks.drain()
        assert len(slack.of("chat.postMessage")) == 2  # the thread and one card
    finally:
        await h.close()
