"""Posts incidents to Slack through the Web API (chat.postMessage, chat.update, files upload v2).

The ``AsyncWebClient`` is injected: production points it at slack.com, tests at a local fake.
Slack's errors become ``DeliveryFailed`` here, the one boundary for this client, with the verdict
on trying again decided where the error happened (``bot/surfaces/slack/failures.py``).

Messages reach a public channel without the bot in it (``chat:write.public``); files do not:
files upload v2 answers ``not_in_channel``. The bot then joins the channel
(``conversations.join``, scope ``channels:join``) and uploads again; where it cannot join (a
private channel), the error says to invite it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.diagnosis import Diagnosis
from bot.kernel import EndpointError
from bot.kernel.chat import IncidentView, MessageRef
from bot.postmortem import DraftView
from bot.remediation import RemediationView
from bot.surfaces.slack.failures import SLACK_ERRORS, slack_boundary, slack_failure
from bot.surfaces.slack.remediation_views import draft_message, remediation_card
from bot.surfaces.slack.views import (
    adr_message,
    findings_message,
    root_message,
    thread_buttons_message,
    withheld_text,
)


class SlackNotifier:
    """The Slack implementation of the Notifier role."""

    def __init__(
        self, client: AsyncWebClient, *, page_url: Callable[[int], str] | None = None
    ) -> None:
        self._client = client
        self._page_url = page_url  # an incident's signed page link ([web] public_url set)

    def _page(self, incident_id: int) -> str | None:
        return None if self._page_url is None else self._page_url(incident_id)

    async def post_root(self, *, channel: str, view: IncidentView) -> MessageRef:
        """chat.postMessage in the channel; the answer's channel ID and ts name the thread."""
        with slack_boundary(f"Slack refused the incident message in {channel}"):
            text, blocks = root_message(view, page_url=self._page(view.id))
            response = await self._client.chat_postMessage(
                channel=channel, text=text, blocks=blocks
            )
        return MessageRef(channel=str(response["channel"]), ts=str(response["ts"]))

    async def update_root(self, ref: MessageRef, *, view: IncidentView) -> None:
        """chat.update of the root message (with a fresh page link)."""
        with slack_boundary("Slack refused to update the incident message"):
            text, blocks = root_message(view, page_url=self._page(view.id))
            await self._client.chat_update(channel=ref.channel, ts=ref.ts, text=text, blocks=blocks)

    def render_diagnosis(self, diagnosis: Diagnosis, *, incident_id: int) -> list[dict[str, Any]]:
        """Findings, then the matching ADRs: two thread messages (text and blocks)."""
        findings = findings_message(diagnosis, page_url=self._page(incident_id))
        adrs = adr_message(
            diagnosis.matches, incident_id=incident_id, target=diagnosis.target,
            withheld=withheld_text(diagnosis),
        )  # fmt: skip
        return [{"text": text, "blocks": blocks} for text, blocks in (findings, adrs)]

    def render_thread_buttons(
        self, tokens: dict[str, str], *, note: str | None = None
    ) -> dict[str, Any]:
        """Silence / Acknowledge as one thread message (text and blocks)."""
        text, blocks = thread_buttons_message(tokens, note=note)
        return {"text": text, "blocks": blocks}

    async def post_rendered(self, ref: MessageRef, *, message: dict[str, Any]) -> MessageRef:
        """chat.postMessage of a rendered message in the thread."""
        return await self._reply(ref, text=str(message["text"]), blocks=message.get("blocks"))

    async def post_chart(self, ref: MessageRef, *, png: bytes, title: str, filename: str) -> None:
        """files upload v2 (get URL, upload, complete) into the thread."""
        with slack_boundary("Slack refused the chart upload"):
            await self._upload(
                channel=ref.channel, thread_ts=ref.ts, content=png, filename=filename, title=title
            )

    async def post_reply(self, ref: MessageRef, *, text: str) -> None:
        """A plain message in the thread."""
        await self._reply(ref, text=text, blocks=None)

    async def post_remediation(self, thread: MessageRef, *, view: RemediationView) -> MessageRef:
        """The confirmation card in the thread; later steps update it."""
        with slack_boundary("Slack refused a thread message"):
            text, blocks = remediation_card(view)
        return await self._reply(thread, text=text, blocks=blocks)

    async def update_remediation(self, ref: MessageRef, *, view: RemediationView) -> None:
        """chat.update of the card."""
        with slack_boundary("Slack refused to update a message"):
            text, blocks = remediation_card(view)
        await self._update(ref, text=text, blocks=blocks)

    async def permalink(self, ref: MessageRef) -> str | None:
        """chat.getPermalink of a message; None when Slack will not say."""
        try:
            response = await self._client.chat_getPermalink(channel=ref.channel, message_ts=ref.ts)
        except SLACK_ERRORS:
            return None
        link = response.get("permalink")
        return str(link) if link else None

    async def post_draft(
        self, thread: MessageRef, *, view: DraftView, markdown: str, filename: str
    ) -> MessageRef:
        """The draft's summary with review buttons, then the Markdown file, in the thread."""
        with slack_boundary("Slack refused a thread message"):
            text, blocks = draft_message(view)
        ref = await self._reply(thread, text=text, blocks=blocks)
        with slack_boundary("Slack refused the ADR draft upload"):
            await self._upload(
                channel=thread.channel,
                thread_ts=thread.ts,
                content=markdown.encode(),
                filename=filename,
                title=f"{view.adr_id} (draft)",
            )
        return ref

    async def update_draft(self, ref: MessageRef, *, view: DraftView) -> None:
        """chat.update of the draft's summary."""
        with slack_boundary("Slack refused to update a message"):
            text, blocks = draft_message(view)
        await self._update(ref, text=text, blocks=blocks)

    async def _upload(self, *, channel: str, **file: Any) -> None:
        """files upload v2 into ``channel``, joining it first when Slack says the bot is not in."""
        try:
            await self._client.files_upload_v2(channel=channel, **file)
            return
        except SlackApiError as exc:
            if exc.response.get("error") != "not_in_channel":
                raise
        try:
            await self._client.conversations_join(channel=channel)
        except SlackApiError as exc:
            if not slack_failure(exc).permanent:
                raise  # Slack is failing: try again later, not "invite the bot"
            raise EndpointError(
                f"the bot is not a member of channel {channel} and cannot join it "
                f"({exc.response.get('error')}): invite it with `/invite @ruleloop` "
                "(a private channel), or give the app the channels:join scope."
            ) from exc
        await self._client.files_upload_v2(channel=channel, **file)

    async def _update(self, ref: MessageRef, *, text: str, blocks: list[dict[str, object]]) -> None:
        with slack_boundary("Slack refused to update a message"):
            await self._client.chat_update(channel=ref.channel, ts=ref.ts, text=text, blocks=blocks)

    async def _reply(
        self, ref: MessageRef, *, text: str, blocks: list[dict[str, object]] | None
    ) -> MessageRef:
        with slack_boundary("Slack refused a thread message"):
            response = await self._client.chat_postMessage(
                channel=ref.channel, thread_ts=ref.ts, text=text, blocks=blocks
            )
        return MessageRef(channel=str(response["channel"]), ts=str(response["ts"]))
