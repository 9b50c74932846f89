"""Fuzz /slack/events in-process (issue 22 item 4): signed and unsigned slash commands,
interaction payloads, Events API JSON and raw bytes, through the real bolt app built by the
test harness, the fake Slack Web API at the wire. No request is a 5xx, no traceback is logged;
a malformed signed one is a 400 or a short ephemeral "could not read this request".

One bot serves every example of a test (built once, on one event loop): its replay guard
refuses a repeated signature, which is also an answer (401)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import logging
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import SIGNING_SECRET, FakeSlack
from tests.fuzzing import examples

pytestmark = pytest.mark.faults

EXAMPLES = examples(1_000)  # per test in `make test`; `make fuzz`: 10,000 each
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same examples on every run (CI reproduces a failure)
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
UNREADABLE = "could not read this request"
FORM = "application/x-www-form-urlencoded"
SIGNED = st.sampled_from([True, True, True, False])  # mostly signed: those reach bolt
HERE = "RESPONSE-URL"  # stands for the fake Slack's response_url, filled in when posted

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=6), inner, max_size=2),
    max_leaves=4,
)  # fmt: skip
# Cheap to draw: a value of each JSON type where a field of another type is expected.
JUNK = st.sampled_from([None, True, 0, -1, 1.5, 2**64, "", "x", [], [1], ["x"], {}, {"id": 1},
                        {"id": None}, {"id": "U1"}, [{"id": 1}], [{}]])  # fmt: skip
IDS = st.sampled_from(["U1", "U2", "U0EXT", "T0FAKE", "T0VENDOR", "E0", "C0INCIDENTS", ""])
TEXT = st.text(max_size=12) | IDS
URLS = st.sampled_from([HERE, "not a url", "http://", "ftp://x/y", "http://a b/"]) | JUNK
SLASH = st.sampled_from(["/diagnose", "/apply-adr", "/adr-draft", "/other", "", "diagnose"])
ACTION_IDS = st.sampled_from(
    ["apply_adr", "remediation_approve", "remediation_deny", "adr_draft_accept",
     "adr_draft_reject", "incident_silence", "incident_acknowledge", "incident_cause_confirmed",
     "incident_cause_wrong", "other", ""]
)  # fmt: skip
TYPES = st.sampled_from(
    ["block_actions", "interactive_message", "dialog_submission", "dialog_cancellation",
     "dialog_suggestion", "block_suggestion", "view_submission", "view_closed", "shortcut",
     "message_action", "workflow_step_edit", "event_callback", "url_verification", ""]
)  # fmt: skip
# What may sit where bolt, the guard or a listener reads an object or an id.
OBJ = st.fixed_dictionaries({}, optional={"id": TEXT | JUNK, "team_id": TEXT | JUNK,
                                          "enterprise_id": TEXT | JUNK}) | JUNK  # fmt: skip
VALUES = (st.sampled_from(['{"adr": "ADR-20260831-01", "incident": 1, "target": "prod-a"}',
                          '{"adr": 1}', '{"adr": "x", "incident": 1e999}', "[1]",
                          '{"adr": "x", "incident": 99999999999999999999}', "tok"])
          | TEXT | JUNK)  # fmt: skip
ACTION = st.fixed_dictionaries(
    {},
    optional={"action_id": ACTION_IDS | JUNK, "value": VALUES, "type": st.just("button"),
              "block_id": TEXT | JUNK, "name": ACTION_IDS},
)  # fmt: skip


@dataclass
class Fuzzed:
    """The bot under fuzz, its fake Slack, and what the examples saw."""

    h: Harness
    slack: FakeSlack
    loop: asyncio.Runner
    tracebacks: list[logging.LogRecord] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    seen: set[bytes] = field(default_factory=set)
    _ts: Iterator[int] = field(default_factory=lambda: itertools.cycle(range(250)))

    def __repr__(self) -> str:  # shown with a failing example
        return f"Fuzzed(statuses={self.statuses})"

    def post(self, body: bytes, *, ctype: str | None = FORM, signed: bool = True) -> Any:
        """POST ``body`` (HERE: the fake's response_url), signed or not; check the answer."""
        here = self.slack.response_url("fuzz")
        body = body.replace(
            HERE.encode(), here.encode() if ctype != FORM else quote(here, safe="").encode()
        )
        headers = sign(body, timestamp=int(time.time()) - next(self._ts))
        if not signed:
            headers["X-Slack-Signature"] = "v0=" + "0" * 64
        if ctype is None:
            headers.pop("Content-Type", None)
        else:
            headers["Content-Type"] = ctype
        answered = self.loop.run(self.h.client.post("/slack/events", content=body, headers=headers))
        self.statuses[answered.status_code] = self.statuses.get(answered.status_code, 0) + 1
        assert answered.status_code < 500, (body, answered.text)
        if not signed:
            assert answered.status_code == 401
        elif answered.status_code == 400:
            assert answered.json()["error"].startswith(UNREADABLE)
        elif answered.status_code == 200 and answered.content:
            reply = answered.json()  # a slash command's own answer: short and ephemeral
            assert reply["response_type"] == "ephemeral" and len(reply["text"]) < 300
        else:
            assert answered.status_code in (200, 401), (body, answered.status_code)
        return answered


class Tracebacks(logging.Handler):
    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.into.append(record)


@pytest.fixture
def fuzzed(tmp_path: Path, slack: FakeSlack) -> Iterator[Fuzzed]:
    slack.user_teams["U0EXT"] = "T0VENDOR"
    loop = asyncio.Runner()
    # nobody may diagnose: well-formed commands are refused at once, no diagnosis runs
    access = {"diagnose": ["U9"], "apply": ["U1"], "approve": ["U1", "U2"], "review": ["U2"]}
    h = loop.run(_build(tmp_path, slack, access))
    found = Fuzzed(h=h, slack=slack, loop=loop)
    handler = Tracebacks(found.tracebacks)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield found
        loop.run(h.bot.tasks.drain())  # the deferred work of every example, done
        # not vacuous: some examples were refused as unreadable, some reached the listeners
        assert found.statuses.get(400) and found.statuses.get(200), found.statuses
        assert [f"{r.name}: {r.getMessage()}" for r in found.tracebacks] == []
    finally:
        root.removeHandler(handler)
        loop.run(h.close())
        loop.close()


async def _build(tmp_path: Path, slack: FakeSlack, access: dict[str, list[str]]) -> Harness:
    return harness(tmp_path, slack=slack, access=access)


def sign(body: bytes, *, timestamp: int) -> dict[str, str]:
    """Slack's v0 signature of any bytes (slack_sdk's signer takes UTF-8 text only)."""
    base = b"v0:%d:%s" % (timestamp, body)
    digest = hmac.new(SIGNING_SECRET.encode(), base, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": str(timestamp), "X-Slack-Signature": f"v0={digest}"}


def form_of(fields: dict[str, Any]) -> bytes:
    return urllib.parse.urlencode(
        {k: v if isinstance(v, str) else json.dumps(v) for k, v in fields.items()}
    ).encode()


# --- raw bytes and Events API JSON ----------------------------------------------------------
CTYPES = st.sampled_from([FORM, "application/json", "text/plain", None, "application/json; x"])
EVENT = st.fixed_dictionaries(
    {},
    optional={"type": TYPES | JUNK, "event": st.fixed_dictionaries(
        {}, optional={"type": TEXT | JUNK, "user": OBJ, "team": TEXT | JUNK,
                      "user_team": TEXT | JUNK, "channel": OBJ}) | JUNK,
              "challenge": TEXT, "team_id": TEXT | JUNK, "enterprise_id": TEXT | JUNK,
              "authorizations": st.lists(OBJ, max_size=2) | JUNK, "ssl_check": JUNK,
              "is_ext_shared_channel": st.booleans() | JUNK, "enterprise": OBJ, "team": OBJ,
              "command": SLASH | JUNK, "user_id": TEXT | JUNK, "channel_id": TEXT | JUNK,
              "response_url": URLS, "text": TEXT | JUNK},
)  # fmt: skip
RAW = (
    st.binary(max_size=80)
    | EVENT.map(lambda v: json.dumps(v).encode())
    | JSON.map(lambda v: json.dumps(v).encode())
    | st.text(max_size=40).map(str.encode)
    | st.tuples(st.sampled_from(["payload=", "command=%2Fdiagnose&", "ssl_check=1&"]),
                st.binary(max_size=40)).map(lambda t: t[0].encode() + t[1])
)  # fmt: skip


# Issue 31 items 8 and 9: JSON nested 1,000 deep or more was a RecursionError (500), and a
# signed body that is not UTF-8 a 401 (slack_sdk decoded it to check the signature).
DEEP = st.tuples(
    st.integers(900, 6000),
    st.sampled_from([(b"[", b"]"), (b'{"a":', b"}"), (b"%5B", b"%5D"), (b"%7B%22a%22%3A", b"%7D")]),
    st.sampled_from([b"", b"payload=", b"ssl_check=1&payload=", b"user_id=U1&payload="]),
).map(lambda t: t[2] + t[1][0] * t[0] + b"1" + t[1][1] * t[0])
NOT_UTF8 = st.tuples(
    st.binary(max_size=40) | RAW,
    st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80"]),
    st.binary(max_size=20),
).map(lambda t: t[0] + t[1] + t[2])
RAW = RAW | DEEP | NOT_UTF8


@FUZZ
@given(raw=RAW, ctype=CTYPES, signed=SIGNED)
def test_raw_bytes_and_events_json_are_never_a_5xx(
    fuzzed: Fuzzed, raw: bytes, ctype: str | None, signed: bool
) -> None:
    fuzzed.post(raw, ctype=ctype, signed=signed)


@settings(FUZZ, max_examples=300)
@given(raw=DEEP | NOT_UTF8, ctype=CTYPES)
def test_deep_or_undecodable_signed_bodies_are_a_400(
    fuzzed: Fuzzed, raw: bytes, ctype: str | None
) -> None:
    """Signed, so never a 401 (unless the very same request came before: a replay)."""
    first = raw not in fuzzed.seen
    fuzzed.seen.add(raw)
    answered = fuzzed.post(raw, ctype=ctype, signed=True)
    assert answered.status_code == 400 or not first, (raw[:80], answered.text)


# --- slash commands -------------------------------------------------------------------------
COMMAND = st.fixed_dictionaries(
    {"command": SLASH},
    optional={"text": TEXT | st.sampled_from(["ADR-20260831-01 prod-a", "²", "#1", "ADR-1 x y"]),
              "user_id": IDS | TEXT, "channel_id": IDS | TEXT, "team_id": IDS | TEXT,
              "enterprise_id": TEXT, "response_url": URLS, "trigger_id": TEXT,
              "ssl_check": st.sampled_from(["1", "0"]), "authorizations": TEXT | JUNK,
              "response_urls": TEXT | JUNK, "user": TEXT, "team": TEXT, "channel": TEXT | JUNK,
              "enterprise": TEXT, "type": TYPES, "actions": JUNK, "event": JUNK,
              "function_execution_id": TEXT},
)  # fmt: skip


@FUZZ
@given(fields=COMMAND | st.dictionaries(TEXT, TEXT, max_size=4), signed=SIGNED)
def test_slash_commands_are_never_a_5xx(
    fuzzed: Fuzzed, fields: dict[str, Any], signed: bool
) -> None:
    fuzzed.post(form_of(fields), signed=signed)


# --- interaction payloads -------------------------------------------------------------------
PAYLOAD = st.fixed_dictionaries(
    {"type": TYPES | JUNK},
    optional={"user": OBJ, "team": OBJ, "enterprise": OBJ, "channel": OBJ,
              "actions": st.lists(ACTION, max_size=2) | JUNK, "callback_id": ACTION_IDS | JUNK,
              "response_url": URLS, "response_urls": JUNK, "authorizations": JUNK, "view": OBJ,
              "message": OBJ, "is_enterprise_install": JUNK, "function_execution_id": JUNK,
              "team_id": TEXT | JUNK, "user_id": TEXT | JUNK, "submission": JUNK,
              "event": JUNK, "thread_ts": JUNK},
)  # fmt: skip


# a click of one of the bot's buttons, each field as Slack sends it or not
CLICK = st.fixed_dictionaries(
    {"type": st.just("block_actions"),
     "user": st.sampled_from([{"id": "U1"}, {"id": "U2"}, {"id": "U0EXT"},
                              {"id": "U0EXT2", "team_id": "T0VENDOR"}]) | OBJ,
     "team": st.just({"id": "T0FAKE"}) | OBJ, "channel": st.just({"id": "C0INCIDENTS"}) | OBJ,
     "response_url": st.just(HERE) | URLS,
     "actions": st.lists(st.fixed_dictionaries(
         {"action_id": ACTION_IDS, "value": VALUES, "type": st.just("button")},
         optional={"block_id": TEXT | JUNK}), min_size=1, max_size=2) | JUNK},
    optional={"message": OBJ, "view": OBJ, "enterprise": OBJ, "callback_id": ACTION_IDS},
)  # fmt: skip


@FUZZ
@given(
    payload=CLICK.map(json.dumps)
    | PAYLOAD.map(json.dumps)
    | JSON.map(json.dumps)
    | st.text(max_size=30),
    signed=SIGNED,
)
def test_interaction_payloads_are_never_a_5xx(fuzzed: Fuzzed, payload: str, signed: bool) -> None:
    fuzzed.post(form_of({"payload": payload}), signed=signed)
