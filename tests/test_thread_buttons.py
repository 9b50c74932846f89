"""An incident thread's Silence 1h and Acknowledge buttons (Issue 31), against a REAL Alertmanager
(the fixture of tests/test_remediation_silences.py) with Slack faked at the wire: Silence makes
an active silence of the target's matchers that expires on time, a token works once, a user
without access is refused, Acknowledge shows who on the root message, and a dead Alertmanager
is said in the thread (no stack trace).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.engine.process import free_port
from bot.kernel.chat.mrkdwn import unescape
from bot.kernel.store.models import Incident
from tests import store_reads
from tests.fakes.alerts import alert, body
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import FakeSlack
from tests.test_remediation_silences import alertmanager, notified  # noqa: F401  (fixtures)
from tests.test_remediation_slack import buttons

SILENCE_S = 3.0  # the test's thread_silence_s


@dataclass
class Thread:
    """A bot with one diagnosed incident on prod-a, its thread's buttons, the Alertmanager."""

    h: Harness
    slack: FakeSlack
    am: str
    buttons: dict[str, str]  # action_id -> token

    async def press(self, action_id: str, *, user: str = "U1") -> None:
        reply = await self.h.click(self.buttons[action_id], user=user, action_id=action_id)
        assert reply.status_code == 200, reply.text
        await self.h.bot.tasks.drain()

    def silences(self) -> list[dict[str, Any]]:
        return list(httpx.get(f"{self.am}/api/v2/silences", timeout=5).json())

    def thread_texts(self) -> list[str]:
        return [unescape(str(c.args.get("text"))) for c in self.slack.of("chat.postMessage")
                if c.args.get("thread_ts")]  # fmt: skip

    def answers(self) -> list[str]:
        return [str(c.args["text"]) for c in self.slack.of("response_url")]

    def actions(self) -> list[tuple[str, str]]:
        with self.h.bot.db.transaction() as s:
            return [(e.actor, e.action) for e in store_reads.audit_trail(s)
                    if e.action.startswith(("incident.silence", "incident.acknowledged"))]  # fmt: skip


async def opened(tmp_path: Path, slack: FakeSlack, am: str | None) -> AsyncIterator[Thread]:
    target: dict[str, Any] = {"vllm_url": "http://10.0.0.5:8000", "actuator": {"kind": "dry-run"}}
    if am is not None:
        target["silence"] = {"alertmanager_url": am, "thread_silence_s": SILENCE_S}
    h = harness(tmp_path, slack=slack, targets={"prod-a": target})
    try:
        answer = await h.webhook(body(alert(ruleloop_target="prod-a")))
        assert answer.json()["outcome"] == "opened"
        await h.bot.tasks.drain()
        [message] = [c for c in slack.of("chat.postMessage") if buttons(c)]
        yield Thread(h=h, slack=slack, am=am or "", buttons=buttons(message))
    finally:
        await h.close()


@pytest.fixture
async def thread(tmp_path: Path, slack: FakeSlack, alertmanager: str) -> AsyncIterator[Thread]:  # noqa: F811
    async for made in opened(tmp_path, slack, alertmanager):
        yield made


async def test_silence_creates_a_silence_of_the_target_that_expires_on_time_and_works_once(
    thread: Thread,
) -> None:
    assert set(thread.buttons) == {"incident_silence", "incident_acknowledge"}
    await thread.press("incident_silence", user="U1")
    [silence] = thread.silences()
    assert silence["status"]["state"] == "active"
    assert silence["matchers"] == [
        {"name": "ruleloop_target", "value": "prod-a", "isRegex": False, "isEqual": True}
    ]
    assert "incident #1" in silence["comment"] and "by U1" in silence["comment"]
    said = [t for t in thread.thread_texts() if "silenced for 3s by <@U1> until" in t]
    assert len(said) == 1 and f"(Alertmanager silence {silence['id']})" in said[0]
    assert thread.actions() == [("U1", "incident.silence_requested"), ("U1", "incident.silenced")]

    await thread.press("incident_silence", user="U1")  # the same token again
    assert any("already used by <@U1>" in a for a in thread.answers())
    assert len(thread.silences()) == 1
    assert len(thread.actions()) == 2

    deadline = time.monotonic() + SILENCE_S + 10  # its end, plus Alertmanager's own slack
    while thread.silences()[0]["status"]["state"] != "expired":
        assert time.monotonic() < deadline, thread.silences()
        await asyncio.sleep(0.2)


async def test_a_user_without_access_is_refused_and_nothing_is_silenced(thread: Thread) -> None:
    await thread.press("incident_silence", user="U9")
    assert any("You may not silence or acknowledge incidents" in a for a in thread.answers())
    assert thread.silences() == []
    assert thread.actions() == []
    await thread.press("incident_acknowledge", user="U9")
    assert len([a for a in thread.answers() if "You may not" in a]) == 2
    assert not any("acknowledged by" in json.dumps(c.args) for c in thread.slack.of("chat.update"))


async def test_acknowledge_shows_who_on_the_root_message(thread: Thread) -> None:
    before = len(thread.slack.of("chat.update"))
    await thread.press("incident_acknowledge", user="U1")
    updates = thread.slack.of("chat.update")[before:]
    assert updates and "acknowledged by <@U1>" in json.dumps(updates[-1].args)
    with thread.h.bot.db.transaction() as s:
        assert s.get(Incident, 1).acknowledged_by == "U1"  # type: ignore[union-attr]
    assert thread.actions() == [("U1", "incident.acknowledged")]
    assert thread.silences() == []  # the other button is untouched, and still usable
    await thread.press("incident_silence", user="U1")
    assert [s["status"]["state"] for s in thread.silences()] == ["active"]


async def test_without_a_silence_config_only_acknowledge_is_offered(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async for made in opened(tmp_path, slack, None):
        assert set(made.buttons) == {"incident_acknowledge"}


async def test_a_dead_alertmanager_is_said_in_the_thread(tmp_path: Path, slack: FakeSlack) -> None:
    async for made in opened(tmp_path, slack, f"http://127.0.0.1:{free_port()}"):
        await made.press("incident_silence", user="U1")
        [said] = [t for t in made.thread_texts() if "NOT silenced" in t]
        assert "Alertmanager did not answer" in said and "Traceback" not in said
        assert made.actions() == [("U1", "incident.silence_requested"),
                                  ("U1", "incident.silence_failed")]  # fmt: skip
        [again] = [c for c in slack.of("chat.postMessage") if "NOT silenced" in str(c.args)]
        assert set(buttons(again)) == {"incident_silence"}  # a fresh button to try again
