"""A message the bot cannot build is not a Slack outage (docs/reliability.md): slack_sdk refusing
a request or a block locally (``SlackRequestError``, ``SlackObjectFormationError``) ends that
message ``failed`` at once with its reason, and the incident's later messages still go.

Through the real bot: the webhook over ASGI, real SQLite, the fake Slack Web API at the wire."""

from __future__ import annotations

from pathlib import Path

import pytest
from slack_sdk.errors import SlackObjectFormationError, SlackRequestError
from slack_sdk.models.blocks import SectionBlock
from slack_sdk.models.blocks.basic_components import MarkdownTextObject
from slack_sdk.web import internal_utils
from sqlalchemy import select

from bot.kernel.chat.failures import DeliveryFailed, classify
from bot.kernel.store import outbox as items
from bot.kernel.store.models import OutboxItem
from bot.surfaces.slack.failures import slack_boundary
from tests.fakes.alerts import body
from tests.fakes.bot import harness
from tests.fakes.slack_api import FakeSlack

pytestmark = pytest.mark.faults


async def test_a_chart_slack_sdk_refuses_to_send_fails_at_once_and_the_rest_goes(
    tmp_path: Path, slack: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was "Slack unreachable": retried for 24 h, every later message of the incident held
    up behind it, and the outbox round stopped as if Slack were down. slack_sdk refuses a
    file over its upload limit before sending a byte; the limit is lowered to the chart's size
    here so that the incident's real chart is such a file."""
    monkeypatch.setattr(internal_utils, "MAX_V2_FILE_SIZE", 16)
    h = harness(tmp_path, slack=slack)
    try:
        assert (await h.webhook(body())).status_code == 202
        await h.bot.tasks.drain()
        with h.bot.db.transaction() as s:
            chart = s.scalars(select(OutboxItem).where(OutboxItem.kind == items.CHART)).one()
            assert (chart.state, chart.attempts) == ("failed", 1)
            assert chart.last_error is not None
            assert chart.last_error.startswith("the message could not be built"), chart.last_error
            assert "Maximum upload file size is 16 bytes" in chart.last_error  # slack_sdk's why
        texts = [str(c.args.get("text", "")) for c in slack.of("chat.postMessage")]
        assert any(t.startswith("The chart could not be posted: the message could not be built")
                   for t in texts), texts  # fmt: skip
        with h.bot.db.transaction() as s:  # a later message of the incident is not held up
            items.owe(s, 1, kind=items.REPLY, at=h.wall.now(), key="later",
                      payload={"text": "a later message of the incident"})  # fmt: skip
        done = await h.bot.flows.outbox.deliver(1)
        assert (done.sent, done.retried, done.unreachable) == (1, 0, False)
        assert slack.of("chat.postMessage")[-1].args["text"] == "a later message of the incident"
    finally:
        await h.close()


def _formation_error() -> SlackObjectFormationError:
    try:
        SectionBlock(text=MarkdownTextObject(text="x" * 3001)).to_dict()
    except SlackObjectFormationError as exc:
        return exc
    raise AssertionError("slack_sdk built a 3,001-character section")


@pytest.mark.parametrize(
    "cause",
    [
        _formation_error(),
        SlackRequestError("Any of file, content, and file_uploads must be specified."),
    ],
    ids=["SlackObjectFormationError", "SlackRequestError"],
)
def test_a_message_built_wrong_here_is_permanent_not_slack_unreachable(cause: Exception) -> None:
    """As the notifier raises it: through its Slack boundary, which decides the verdict."""
    try:
        with slack_boundary("Slack refused a thread message"):
            raise cause
    except DeliveryFailed as exc:
        failure = classify(exc)
    assert failure.permanent and not failure.unreachable
    assert failure.reason.startswith("the message could not be built"), failure.reason
    assert str(cause) in failure.reason
