"""What the channel hears when an open incident's alerts change (issue 22, item 15): an alert
that joins, or one that resolves while others still fire, is one short line in the thread,
owed through the outbox in the webhook's transaction. The real bot over ASGI, real SQLite,
the fake Slack at the wire; and the console transport prints the incident page's link.
"""

from __future__ import annotations

import re
from pathlib import Path

from bot.kernel.chat.mrkdwn import unescape
from tests.fakes.alerts import alert, body
from tests.fakes.bot import harness
from tests.fakes.slack_api import FakeSlack

GROUP = '{}:{instance="10.0.0.5:8000"}'
TTFT = {"name": "VLLMTimeToFirstTokenP99High", "fingerprint": "00000000000000a1"}
QUEUE = {"name": "VLLMQueueTimeP99High", "fingerprint": "00000000000000b2"}


def notification(*alerts: dict[str, object]) -> bytes:
    return body(*alerts, group_key=GROUP, groupLabels={"instance": "10.0.0.5:8000"})


def thread_texts(slack: FakeSlack) -> list[str]:
    return [
        unescape(str(c.args.get("text")))
        for c in slack.of("chat.postMessage")
        if c.args.get("thread_ts")
    ]


async def test_an_alert_joining_and_one_resolving_are_said_in_the_thread(
    tmp_path: Path, slack: FakeSlack
) -> None:
    """Before: `incident.alerts_changed` was audited and nothing was posted: the channel never
    heard that the queue-time alert joined."""
    h = harness(tmp_path, slack=slack)
    try:
        first = await h.webhook(notification(alert(ruleloop_target="prod-a", **TTFT)))
        assert first.json()["outcome"] == "opened"
        await h.bot.tasks.drain()
        before = len(thread_texts(slack))
        joined = await h.webhook(
            notification(
                alert(ruleloop_target="prod-a", **TTFT), alert(ruleloop_target="prod-a", **QUEUE)
            )  # fmt: skip
        )
        assert joined.json()["outcome"] == "updated"
        await h.bot.tasks.drain()  # delivered at once, not at the next outbox round
        assert thread_texts(slack)[before:] == ["`VLLMQueueTimeP99High` joined (firing)"]
        one_left = await h.webhook(
            notification(
                alert(ruleloop_target="prod-a", status="resolved", **TTFT),
                alert(ruleloop_target="prod-a", **QUEUE),
            )  # fmt: skip
        )
        assert one_left.json()["outcome"] == "updated"
        await h.bot.tasks.drain()
        assert thread_texts(slack)[before + 1 :] == [
            "`VLLMTimeToFirstTokenP99High` resolved; 1 of 2 still firing"
        ]
        again = await h.webhook(
            notification(
                alert(ruleloop_target="prod-a", status="resolved", **TTFT),
                alert(ruleloop_target="prod-a", **QUEUE),
            )  # fmt: skip
        )
        assert again.json()["outcome"] == "duplicate"  # a repeat says nothing new
        await h.bot.tasks.drain()
        assert len(thread_texts(slack)) == before + 2
    finally:
        await h.close()


async def test_the_console_prints_the_incident_page_link(tmp_path: Path) -> None:
    """Before: the console transport printed no link (`ruleloop page-link` had to be used)."""
    secret = "s" * 40
    h = harness(tmp_path, slack=None, web={"link_secret": secret,
                                           "public_url": "https://ruleloop.example"})  # fmt: skip
    try:
        assert (await h.webhook(body(alert(ruleloop_target="prod-a")))).status_code == 202
        await h.bot.tasks.drain()
    finally:
        await h.close()
    (root,) = [line for line in h.console.getvalue().splitlines() if "incident #1" in line][:1]
    link = re.search(r"page (https://ruleloop\.example/\S+)", root)
    assert link is not None, root
    assert "/incidents/1" in link.group(1)
