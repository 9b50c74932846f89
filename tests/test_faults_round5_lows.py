"""Hardening round 5 (issue 45), its low findings, each reproduced through the real bot
(create_bot: the real slack-bolt app, signed requests, the Alertmanager webhook route; Slack and
Alertmanager's silences API faked at the wire):

- the Silence button of a resolved incident still silenced its target for an hour;
- the silence id Alertmanager answered, and the presser's user.id, were posted into the thread
  unescaped (``<!channel>`` and a disguised link came out live);
- one Alertmanager group holding a prod-a and a prod-b alert was filed wholly under prod-a, and
  a groupKey spelled ``target:prod-b`` joined prod-b's open incident;
- an edited Apply button value (prod-a's incident, target prod-b) made a pending prod-b change
  in prod-a's thread;
- a signed Slack body with ``"event": null`` raised inside bolt's middleware (a traceback, 200).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select

from bot.incidents.intake.models import parse_webhook
from bot.incidents.intake.service import Intake
from bot.kernel.config import Target
from bot.kernel.store.db import Database
from bot.kernel.store.models import Alert, Incident, OutboxItem, Remediation
from tests import store_reads
from tests.fakes.alerts import alert, body, payload
from tests.fakes.bot import RUNBOOK, Harness, adr_dir, harness
from tests.fakes.slack_api import FakeSlack, signed_headers
from tests.test_remediation_slack import buttons
from tests.traced import peak_of

pytestmark = pytest.mark.faults

ADR = "ADR-20260831-01"  # the seed ADR: cause kv_cache_pressure
EVERYONE = {"diagnose": ["*"], "apply": ["*"], "approve": ["*"], "review": ["*"]}
HOSTILE = "<!channel> <http://x|disguised>"
PROD_B = {"vllm_url": "http://10.0.0.6:8000", "actuator": {"kind": "dry-run"}}


class FakeAlertmanager:
    """Alertmanager's ``POST /api/v2/silences`` at the wire: each body it was sent, answered
    with ``silence_id``."""

    def __init__(self, silence_id: str = "5f1c0d3e-silence") -> None:
        self.silence_id = silence_id
        self.created: list[dict[str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                size = int(self.headers.get("Content-Length", 0))
                fake.created.append(json.loads(self.rfile.read(size)))
                answer = json.dumps({"silenceID": fake.silence_id}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeAlertmanager:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def am() -> Iterator[FakeAlertmanager]:
    with FakeAlertmanager() as fake:
        yield fake


def targets(am: FakeAlertmanager) -> dict[str, Any]:
    """prod-a (silenced through the fake Alertmanager for an hour) and prod-b."""
    silence = {"alertmanager_url": am.url, "thread_silence_s": 3600}
    prod_a = {"vllm_url": "http://10.0.0.5:8000", "actuator": {"kind": "dry-run"},
              "silence": silence}  # fmt: skip
    return {"prod-a": prod_a, "prod-b": PROD_B}


def hook(*alerts: dict[str, Any], **kwargs: Any) -> bytes:
    """A notification whose commonLabels are only what its alerts share (as Alertmanager's)."""
    sent = payload(*alerts, **kwargs)
    common = set.intersection(*(set(a["labels"].items()) for a in sent["alerts"]))
    sent["commonLabels"] = dict(sorted(common))
    return json.dumps(sent).encode()


def thread_buttons(slack: FakeSlack) -> dict[str, str]:
    """The action_id -> token of every thread button posted (the latest of each)."""
    found: dict[str, str] = {}
    for call in slack.of("chat.postMessage"):
        if call.args.get("blocks"):
            found.update(buttons(call))
    return found


def answers(slack: FakeSlack) -> list[str]:
    """What the bot answered the clicker (ephemerally, at the payload's response_url)."""
    return [str(c.args.get("text")) for c in slack.of("response_url")]


def posted(slack: FakeSlack) -> str:
    """Every message and update the bot sent, as one JSON text (buttons' values included)."""
    calls = slack.of("chat.postMessage") + slack.of("chat.update") + slack.of("response_url")
    return json.dumps([c.args for c in calls], ensure_ascii=False)


def audited(h: Harness, prefix: str) -> list[str]:
    with h.bot.db.transaction() as s:
        return [e.action for e in store_reads.audit_trail(s) if e.action.startswith(prefix)]


def remediations(h: Harness) -> list[tuple[int | None, str, str]]:
    with h.bot.db.transaction() as s:
        rows = s.scalars(select(Remediation)).all()
        return [(r.incident_id, r.target, r.state) for r in rows]


async def opened(h: Harness, *alerts: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """POST a notification, let what it starts finish; the webhook's answer."""
    answer = await h.webhook(hook(*alerts, **kwargs))
    assert answer.status_code in (200, 202), answer.text
    await h.bot.tasks.drain()
    return dict(answer.json())


# --- 1: the Silence button of a resolved incident -------------------------------------------


async def test_the_silence_button_of_a_resolved_incident_silences_nothing(
    tmp_path: Path, slack: FakeSlack, am: FakeAlertmanager
) -> None:
    """Reproduction: the incident resolved, then its Silence button silenced prod-a for 1h."""
    h = harness(tmp_path, slack=slack, targets=targets(am))
    try:
        assert (await opened(h, alert(ruleloop_target="prod-a")))["outcome"] == "opened"
        silence = thread_buttons(slack)["incident_silence"]
        resolved = await opened(h, alert(ruleloop_target="prod-a", status="resolved"))
        assert resolved["outcome"] == "resolved"
        reply = await h.click(silence, action_id="incident_silence")
        assert reply.status_code == 200
        await h.bot.tasks.drain()
    finally:
        await h.close()
    assert am.created == []
    assert any("this incident is resolved; nothing silenced" in a for a in answers(slack))
    assert audited(h, "incident.silence") == []


# --- 2: Alertmanager's silence id and the presser's user.id, escaped ------------------------


async def test_a_hostile_silence_id_and_user_id_never_become_live_markup(
    tmp_path: Path, slack: FakeSlack, am: FakeAlertmanager
) -> None:
    """Reproduction: the silence id ``<!channel> <http://x|disguised>`` and a user.id holding
    the same came out live in the silence and the cause notes."""
    am.silence_id = HOSTILE
    runbooks = tmp_path / "cause-runbooks"
    runbooks.mkdir()
    (runbooks / "test.yaml").write_text(
        RUNBOOK + "hypotheses:\n  - cause: kv_cache_pressure\n"
        "    supported_when: vllm_metrics.ttft_p99_ms > 1\n"
        '    number: "{vllm_metrics.ttft_p99_ms} ms"\n'
        '    evidence: "TTFT p99 {vllm_metrics.ttft_p99_ms}"\n'
    )
    paths = {"runbooks": str(runbooks), "adr": str(adr_dir(tmp_path, matching=True))}
    h = harness(tmp_path, slack=slack, matching_adr=True, paths=paths, access=EVERYONE,
                targets=targets(am))  # fmt: skip
    user = f"U1 {HOSTILE}"
    try:
        await opened(h, alert(ruleloop_target="prod-a"))
        pressed = thread_buttons(slack)
        await h.click(pressed["incident_silence"], user=user, action_id="incident_silence")
        await h.click(pressed["incident_cause_wrong"], user=user, action_id="incident_cause_wrong")
        await h.bot.tasks.drain()
    finally:
        await h.close()
    assert len(am.created) == 1
    assert audited(h, "incident.silenced") == ["incident.silenced"]
    assert audited(h, "cause.wrong") == ["cause.wrong"]
    shown = posted(slack)
    assert "<!channel>" not in shown and "<http://x|disguised>" not in shown
    texts = [str(c.args.get("text")) for c in slack.of("chat.postMessage")]
    [silenced] = [t for t in texts if ":no_bell:" in t]
    assert "(Alertmanager silence &lt;!channel&gt; &lt;http://x|disguised&gt;)" in silenced
    assert "by <@U1 &lt;!channel&gt; &lt;http://x|disguised&gt;>" in silenced
    [cause] = [t for t in texts if ":memo:" in t]
    assert cause.startswith(":memo: <@U1 &lt;!channel&gt; &lt;http://x|disguised&gt;>")


# --- 3: an alert joins only its own target's incident ---------------------------------------


def _incidents(h: Harness) -> dict[str | None, list[str]]:
    """Each incident's target -> the fingerprints of its alerts."""
    with h.bot.db.transaction() as s:
        alerts = s.scalars(select(Alert)).all()
        return {
            incident.target: sorted(a.fingerprint for a in alerts if a.incident_id == incident.id)
            for incident in s.scalars(select(Incident)).all()
        }


async def test_a_group_of_two_targets_files_each_alert_under_its_own(
    tmp_path: Path, slack: FakeSlack, am: FakeAlertmanager
) -> None:
    """Reproduction: one group of a prod-a and a prod-b alert was one prod-a incident."""
    h = harness(tmp_path, slack=slack, targets=targets(am))
    try:
        answer = await opened(
            h,
            alert(ruleloop_target="prod-a", fingerprint="aaaa"),
            alert(ruleloop_target="prod-b", instance="10.0.0.6:8000", fingerprint="bbbb"),
        )
    finally:
        await h.close()
    assert answer["outcome"] == "opened"
    assert _incidents(h) == {"prod-a": ["aaaa"], "prod-b": ["bbbb"]}
    assert sorted(audited(h, "incident.opened")) == ["incident.opened"] * 2


async def test_a_group_key_spelled_like_a_target_key_does_not_join_that_target(
    tmp_path: Path, slack: FakeSlack, am: FakeAlertmanager
) -> None:
    """Reproduction: groupKey ``target:prod-b`` joined prod-b's open incident, though no alert
    of it names prod-b."""
    h = harness(tmp_path, slack=slack, targets=targets(am))
    try:
        first = await opened(h, alert(ruleloop_target="prod-b", instance="10.0.0.6:8000",
                                      fingerprint="bbbb"))  # fmt: skip
        assert first["outcome"] == "opened"
        spoof = await opened(h, alert(instance="10.9.9.9:8000", fingerprint="cccc"),
                             group_key="target:prod-b")  # fmt: skip
    finally:
        await h.close()
    assert spoof["outcome"] == "opened" and spoof["incident"] != first["incident"]
    assert _incidents(h) == {"prod-b": ["bbbb"], None: ["cccc"]}


# --- 4: the Apply button's value is bound to its incident -----------------------------------


async def apply_value(h: Harness, slack: FakeSlack) -> dict[str, Any]:
    """/diagnose prod-a to its end; the value of the Apply button its thread offers."""
    await h.slash("prod-a")
    await slack.until("chat.update")
    await h.bot.tasks.drain()
    [value] = [c.args["blocks"][1]["accessory"]["value"] for c in slack.of("chat.postMessage")
               if "apply_adr" in json.dumps(c.args.get("blocks"))]  # fmt: skip
    return dict(json.loads(value))


async def test_an_apply_button_edited_to_another_target_is_refused_and_creates_nothing(
    tmp_path: Path, slack: FakeSlack, am: FakeAlertmanager
) -> None:
    """Reproduction: prod-a's Apply button, its target edited to prod-b, made a pending prod-b
    change in prod-a's thread."""
    h = harness(tmp_path, slack=slack, matching_adr=True, targets=targets(am))
    try:
        sent = await apply_value(h, slack)
        assert sent["target"] == "prod-a" and sent["adr"] == ADR
        await h.click(json.dumps({**sent, "target": "prod-b"}))
        await h.bot.tasks.drain()
    finally:
        await h.close()
    assert remediations(h) == []
    [refused] = [a for a in answers(slack) if "Nothing was changed" in a]
    assert f"incident #{sent['incident']} is about prod-a, not prod-b" in refused


async def test_an_apply_button_naming_an_adr_its_incident_did_not_match_is_refused(
    tmp_path: Path, slack: FakeSlack, am: FakeAlertmanager
) -> None:
    """Reproduction: a value naming an ADR the incident's diagnosis did not match (nothing was
    offered) made a pending change of it in that incident's thread."""
    h = harness(tmp_path, slack=slack, targets=targets(am))
    try:
        incident = (await opened(h, alert(ruleloop_target="prod-a")))["incident"]
        await h.click(json.dumps({"adr": ADR, "incident": incident, "target": "prod-a"}))
        await h.bot.tasks.drain()
    finally:
        await h.close()
    assert remediations(h) == []
    [refused] = [a for a in answers(slack) if "Nothing was changed" in a]
    assert f"{ADR} is not an ADR that incident #{incident}'s diagnosis matched" in refused


async def test_the_apply_button_as_sent_still_requests_the_change(
    tmp_path: Path, slack: FakeSlack, am: FakeAlertmanager
) -> None:
    """The check binds the value; it does not refuse the button the bot posted."""
    h = harness(tmp_path, slack=slack, matching_adr=True, targets=targets(am))
    try:
        sent = await apply_value(h, slack)
        await h.click(json.dumps(sent))
        await h.bot.tasks.drain()
    finally:
        await h.close()
    assert remediations(h) == [(sent["incident"], "prod-a", "pending")]


# --- 5: a Slack body with "event" is refused before bolt reads it ---------------------------


async def test_a_slack_body_with_a_null_event_is_refused_before_bolt(
    tmp_path: Path, slack: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """Reproduction: a signed slash command body carrying ``"event": null`` raised
    AttributeError in bolt's IgnoringSelfEvents middleware: a traceback, answered 200."""
    h = harness(tmp_path, slack=slack)
    command = {"command": "/diagnose", "text": "prod-a", "user_id": "U1",
               "channel_id": "C0INCIDENTS", "team_id": "T0FAKE", "event": None,
               "response_url": slack.response_url("cmd")}  # fmt: skip
    raw = json.dumps(command).encode()
    headers = {**signed_headers(raw), "Content-Type": "application/json"}
    try:
        with caplog.at_level(logging.INFO):
            answer = await h.client.post("/slack/events", content=raw, headers=headers)
            await h.bot.tasks.drain()
    finally:
        await h.close()
    assert answer.status_code == 400, answer.text
    assert "an Events API body" in answer.json()["error"]
    assert [r for r in caplog.records if r.exc_info] == []
    assert any("refused a Slack request" in r.getMessage() and "Events API" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    assert slack.of("response_url") == [] and audited(h, "") == []


# --- 6: a notification's cost does not grow with its incident --------------------------------


def test_a_notification_never_loads_its_incidents_alerts(tmp_path: Path) -> None:
    """Reproduction: each notification loaded every alert of its open incident (250 ms at 900
    alerts, 625 ms for one resolved alert among 12,000; measured here: 268 ms for a new alert
    and 501 ms for a resolved one at 10,000). Now each alert of the notification is looked up
    by its key and the thread line is counted in SQL: no statement reads the incident's alert
    rows, whatever it holds."""
    db = Database(f"sqlite:///{tmp_path / 'incidents.db'}")
    db.create_schema()
    intake = Intake(db=db, targets={"fleet": Target(vllm_url="http://10.9.0.1:8000")},
                    clock=lambda: dt.datetime(2026, 9, 1, tzinfo=dt.UTC))  # fmt: skip
    fleet = [alert(ruleloop_target="fleet", fingerprint=f"{i:016x}", instance=f"10.1.0.{i}:8000")
             for i in range(200)]  # fmt: skip
    intake.receive(parse_webhook(body(*fleet)))
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(" ".join(statement.split()))

    event.listen(db.engine, "before_cursor_execute", seen)
    joined = alert(ruleloop_target="fleet", fingerprint="f" * 16, instance="10.1.0.250:8000")
    gone = {**fleet[0], "status": "resolved", "endsAt": "2026-09-01T02:40:07.861Z"}
    answers = [intake.receive(parse_webhook(body(joined))),
               intake.receive(parse_webhook(body(gone)))]  # fmt: skip
    event.remove(db.engine, "before_cursor_execute", seen)
    assert [a.outcome.value for a in answers] == ["updated", "updated"]
    rows = [s for s in statements if s.startswith("SELECT alerts.id, alerts.incident_id")]
    assert rows and all("alerts.fingerprint = " in s for s in rows), rows
    with db.transaction() as s:
        (news, resolved) = [i.payload["text"] for i in s.scalars(select(OutboxItem)).all()
                            if i.kind == "reply"]  # fmt: skip
    assert news == "`VLLMTimeToFirstTokenP99High on 10.1.0.250:8000` joined (firing)"
    assert resolved.endswith("resolved; 200 of 201 still firing")


# --- 7: a flat body is refused before it is built ---------------------------------------------


@pytest.fixture
async def h(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[Harness]:
    bot = harness(tmp_path, slack=slack)
    yield bot
    await bot.close()


@pytest.mark.parametrize(
    ("unit", "status", "said"),
    [
        (b"1,", 413, "body holds too many JSON values"),  # 524,288 values: refused on the bytes
        (b"{},", 413, "body holds too many JSON values"),
        (b'"k":1,', 413, "body holds too many JSON values"),
    ],
)
async def test_a_flat_one_mib_body_is_refused_before_it_is_materialised(
    h: Harness, unit: bytes, status: int, said: str
) -> None:
    """Reproduction: a 1 MiB notification whose ``alerts`` was a flat list of 1s cost 660 MB
    here (a validation error per entry) before its 422; 16 at once took serve from 155 MB to
    833 MB. Now a body holding more values than 1 MiB of real alerts can is refused on its
    bytes, and alerts or labels of another kind before validation."""
    head = b'{"version":"4","groupKey":"g","status":"firing","alerts":['
    tail = b"1]}"
    body = head + unit * ((1024 * 1024 - len(head) - len(tail)) // len(unit)) + tail
    response, peak = await peak_of(h.webhook(body))
    assert response.status_code == status, response.text
    assert said in response.json()["error"]
    assert peak < 8 << 20, f"peak {peak >> 20} MiB for a 1 MiB body"


async def test_alerts_and_labels_unlike_alertmanagers_are_refused_before_validation(
    h: Harness,
) -> None:
    """Under the value bound, the first alert that is not an object, or label value that is not
    text, is the answer: no error is built for each of the others."""
    sent = payload(alert())
    for alerts, said in (
        ([sent["alerts"][0], *([1] * 5_000)], "alerts.1: an alert is an object"),
        ([{**sent["alerts"][0], "labels": {f"k{i}": i for i in range(900)}}],
         "alerts.0.labels.k0: a label value is text"),
    ):  # fmt: skip
        response, peak = await peak_of(h.webhook(json.dumps({**sent, "alerts": alerts}).encode()))
        assert response.status_code == 422 and said in response.json()["error"], response.text
        assert peak < 8 << 20, f"peak {peak >> 20} MiB"
