"""What the bot reads from a Slack request, checked before bolt or a listener reads it.

The bot receives its slash commands (a form), clicks on its own Block Kit buttons
(``block_actions``: a form with one JSON ``payload``) and Slack's SSL check; nothing else (no
Events API subscription, no modals, no legacy attachments or dialogs). Bolt builds a request's
context from fields it assumes are of the right type (``team`` a dict or a string,
``authorizations`` a list of objects, ...) and matches ``app.action(name)`` on a legacy
``callback_id`` too, and the listeners index what they use. So a request is read here first:
every field bolt or a listener touches must have the type Slack gives it, and any other kind
of request is refused. A request that cannot be read is answered 400, or, for a slash command,
with a short ephemeral "could not read this request" (Slack shows the person that answer);
nothing runs and nothing is logged as an error.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from slack_bolt.request.internals import build_normalized_headers, extract_content_type, parse_body
from slack_bolt.response import BoltResponse

from bot.kernel import RequestRejected
from bot.surfaces.slack.listeners.actions import ACTIONS
from bot.surfaces.slack.listeners.commands import COMMANDS

UNREADABLE = "could not read this request"
BUTTONS = "block_actions"  # the only interaction payload the bot's messages produce
# Bolt reads these when they are objects (for an id, a channel, a thread) or acts on them
# (functions, modals' response_urls); Slack sends none of them with a command or a click.
NEVER_SENT = ("event", "authorizations", "response_urls", "function_execution_id",
              "function_data", "bot_access_token", "item", "assistant_thread",
              "previous_message")  # fmt: skip
HOST = re.compile(r"[A-Za-z0-9.:-]+")


class Unreadable(RequestRejected):
    """A request the bot cannot read; ``slash``: it is a slash command (answered in Slack)."""

    def __init__(self, why: str, *, slash: bool) -> None:
        super().__init__(f"{UNREADABLE}: {why}", status=400)
        self.slash = slash

    def answer(self) -> tuple[int, dict[str, Any]]:
        """The HTTP status and JSON body to answer with."""
        if self.slash:  # shown to the person, ephemerally, as the command's answer
            return 200, {"response_type": "ephemeral", "text": f"{self}. Nothing was done."}
        return 400, {"error": str(self)}

    def bolt_response(self) -> BoltResponse:
        status, body = self.answer()
        return BoltResponse(
            status=status, body=json.dumps(body), headers={"content-type": "application/json"}
        )


def read(raw: bytes, headers: Mapping[str, str]) -> dict[str, Any]:
    """The request's body as bolt will parse it, checked (``check``); Unreadable if not."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Unreadable("the body is not UTF-8", slash=False) from None
    try:
        content_type = extract_content_type(build_normalized_headers(dict(headers.items())))
        body = parse_body(text, content_type)
    except ValueError:  # a payload or a JSON body that is not JSON
        raise Unreadable("the body is not a form or JSON", slash=False) from None
    except RecursionError:  # JSON nested about 1,000 deep: the parser's stack runs out
        raise Unreadable("the body's JSON is nested too deeply", slash=False) from None
    if not isinstance(body, dict):
        raise Unreadable("the body is not a JSON object", slash=False)
    check(body)
    return body


def check(body: Any) -> None:
    """Unreadable unless ``body`` is a slash command, a click on the bot's buttons or an SSL
    check whose every field bolt, the workspace guard or a listener reads has its type."""
    if not isinstance(body, dict):
        raise Unreadable("the body is not an object", slash=False)
    if "event" in body:  # even null: bolt's middleware reads body["event"] as an object
        raise Unreadable(
            'an Events API body (it has "event"): this app subscribes to no events',
            slash=False,
        )
    slash = "command" in body and "type" not in body
    try:
        _check_common(body)
        if "command" in body:
            _check_command(body)
        elif "type" in body:
            _check_click(body)
        elif body.get("ssl_check") != "1":
            raise ValueError("neither a slash command nor a button click")
    except ValueError as exc:
        raise Unreadable(str(exc), slash=slash) from None


def _check_common(body: dict[str, Any]) -> None:
    for name in NEVER_SENT:
        if body.get(name) not in (None, []):
            raise ValueError(f"unexpected {name}")
    for name in ("team_id", "enterprise_id", "user_id", "channel_id", "ssl_check"):
        _text(body, name)
    for name, ids in (("enterprise", ("id",)), ("team", ("id", "enterprise_id")),
                      ("user", ("id", "team_id")), ("channel", ("id",)),
                      ("view", ("app_installed_team_id", "team_id", "callback_id"))):  # fmt: skip
        value = body.get(name)
        if isinstance(value, dict):
            for key in ids:
                _text(value, key, where=f"{name}.")
        elif value is not None and (name == "view" or not isinstance(value, str)):
            raise ValueError(f"{name} is not an object")
    user = body.get("user")
    if not (isinstance(user, str) or isinstance(user, dict) and user.get("id")) and (
        "user_id" not in body and body.get("message") is not None
    ):  # bolt would look for the user in the message, whatever it holds
        raise ValueError("no user")
    if "response_url" in body:
        _url(body["response_url"])


def _check_command(body: dict[str, Any]) -> None:
    if "type" in body or "actions" in body:
        raise ValueError("a slash command with an interaction's fields")
    if not isinstance(body["command"], str) or body["command"] not in COMMANDS:
        raise ValueError("not one of this bot's slash commands")
    for name in ("user_id", "channel_id", "response_url"):
        if not body.get(name):
            raise ValueError(f"no {name}")
    _text(body, "text")


def _check_click(body: dict[str, Any]) -> None:
    kind = body["type"]
    if kind != BUTTONS:
        shown = kind if isinstance(kind, str) and kind.isidentifier() else "this"
        raise ValueError(f"a {shown[:40]} payload: this bot sends Block Kit buttons only")
    user, channel, actions = body.get("user"), body.get("channel"), body.get("actions")
    if not isinstance(user, dict) or not user.get("id"):
        raise ValueError("no user.id")
    if not isinstance(channel, dict) or not channel.get("id"):
        raise ValueError("no channel.id")
    if not body.get("response_url"):
        raise ValueError("no response_url")
    if not isinstance(actions, list) or not actions:
        raise ValueError("no actions")
    for action in actions:
        if not isinstance(action, dict):
            raise ValueError("an action is not an object")
        for name in ("action_id", "value", "block_id"):
            _text(action, name, where="actions[].")
    first = actions[0]  # what bolt dispatches on
    if first.get("action_id") not in ACTIONS or not isinstance(first.get("value"), str):
        raise ValueError("not one of this bot's buttons")


def _text(body: dict[str, Any], name: str, *, where: str = "") -> None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where}{name} is not a string")


def _url(value: Any) -> None:
    """An http(s) URL that an HTTP client can post to (answers go there)."""
    if not isinstance(value, str) or not value.isascii() or not value.isprintable():
        raise ValueError("response_url is not a URL")
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 (raises ValueError for a port that is not one)
    except ValueError:
        raise ValueError("response_url is not a URL") from None
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https") or not HOST.fullmatch(host) or " " in value:
        raise ValueError("response_url is not a URL")
