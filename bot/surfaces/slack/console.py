"""The console transport: with no Slack tokens, each message is printed as readable text.

Charts are written as PNG files next to the store and their path is printed.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from bot.diagnosis import Diagnosis, cause_text, from_summary, replica_text, summary_numbers
from bot.kernel.chat import IncidentView, MessageRef, unescape
from bot.kernel.numbers import FOUR, show, show_reading
from bot.postmortem import DraftView
from bot.remediation import RemediationView
from bot.surfaces.slack.remediation_views import card_text, card_update_text, draft_text
from bot.surfaces.slack.views import (
    NO_MATCH,
    STATE_TEXT,
    THREAD_BUTTONS,
    finding_line,
    withheld_text,
)


class ConsoleNotifier:
    """Prints what the Slack notifier would post."""

    def __init__(
        self,
        *,
        stream: TextIO | None = None,
        chart_dir: Path,
        page_url: Callable[[int], str] | None = None,
    ) -> None:
        self._stream = stream
        self._chart_dir = chart_dir
        self._page_url = page_url  # an incident's signed page link ([web] link_secret set)
        self._ts = itertools.count(1)

    def _page(self, incident_id: int) -> str:
        """' | page <url>', or '' when the incident page is off."""
        return "" if self._page_url is None else f" | page {self._page_url(incident_id)}"

    def _print(self, text: str) -> None:
        stream = self._stream or sys.stdout
        stream.write(text.rstrip() + "\n")
        stream.flush()

    async def post_root(self, *, channel: str, view: IncidentView) -> MessageRef:
        """Print the root message; the ts is a counter."""
        ref = MessageRef(channel=channel, ts=f"console.{next(self._ts)}")
        self._print(f"[{channel} {ref.ts}] " + render_root(view, page=self._page(view.id)))
        return ref

    async def update_root(self, ref: MessageRef, *, view: IncidentView) -> None:
        """Print the root message again, marked as an update."""
        shown = render_root(view, page=self._page(view.id))
        self._print(f"[{ref.channel} {ref.ts} updated] " + shown)

    def render_diagnosis(self, diagnosis: Diagnosis, *, incident_id: int) -> list[dict[str, Any]]:
        """Findings and the matching ADRs as one printed message (already plain text)."""
        lines = [
            f"findings on {diagnosis.target} "
            f"(runbook {diagnosis.runbook}, {diagnosis.sampling_s:.0f} s window):"
        ]
        if diagnosis.replicas is not None:
            lines.append(f"  {replica_text.line(diagnosis.replicas)}")
        if diagnosis.causes:  # causes first, then the findings behind them
            lines += [f"  {line}" for line in cause_text.plain_text(diagnosis.causes)]
        lines += [f"  {unescape(finding_line(f))}" for f in diagnosis.findings] or ["  no finding"]
        if (withheld := withheld_text(diagnosis)) is not None:
            lines.append(f"  {withheld}")
        elif diagnosis.matches:
            for m in diagnosis.matches:
                why = "; ".join(c.explain() for c in m.conditions)
                lines.append(f"  matching ADR {m.adr.id}: {m.adr.title} ({why}) [Apply]")
        else:
            lines.append(f"  {NO_MATCH}")
        return [{"text": "\n".join(lines), "plain": True}]

    def render_thread_buttons(
        self, tokens: dict[str, str], *, note: str | None = None
    ) -> dict[str, Any]:
        """The buttons as a printed line (the console cannot click them)."""
        shown = [kind for kind in THREAD_BUTTONS if kind in tokens]
        names = " ".join(f"[{THREAD_BUTTONS[kind][0]}]" for kind in shown)
        return {"text": f"{note} {names}" if note else names, "plain": True}

    async def post_rendered(self, ref: MessageRef, *, message: dict[str, Any]) -> MessageRef:
        """Print a rendered message (or a mrkdwn reply, shown as the text it stands for)."""
        text = str(message["text"])
        shown = text if message.get("plain") else unescape(text)
        self._print(f"[{ref.channel} {ref.ts} thread] {shown}")
        return ref  # thread messages get no number of their own, as with post_reply

    async def post_chart(self, ref: MessageRef, *, png: bytes, title: str, filename: str) -> None:
        """Write the chart under the chart directory and print its path."""
        self._chart_dir.mkdir(parents=True, exist_ok=True)
        path = self._chart_dir / filename
        path.write_bytes(png)
        self._print(f"[{ref.channel} {ref.ts} thread] chart ({title}): {path}")

    async def post_reply(self, ref: MessageRef, *, text: str) -> None:
        """Print a thread message (mrkdwn, shown as the text it stands for)."""
        self._print(f"[{ref.channel} {ref.ts} thread] {unescape(text)}")

    async def post_remediation(self, thread: MessageRef, *, view: RemediationView) -> MessageRef:
        """Print the card; its ts is a counter."""
        ref = MessageRef(channel=thread.channel, ts=f"console.{next(self._ts)}")
        self._print(f"[{thread.channel} {thread.ts} thread] " + _indent(card_text(view)))
        return ref

    async def update_remediation(self, ref: MessageRef, *, view: RemediationView) -> None:
        """Print the card's new state in a line or two (the diff and gates do not change)."""
        self._print(f"[{ref.channel} {ref.ts} updated] " + _indent(card_update_text(view)))

    async def permalink(self, ref: MessageRef) -> str | None:
        """The console has no links."""
        return None

    async def post_draft(
        self, thread: MessageRef, *, view: DraftView, markdown: str, filename: str
    ) -> MessageRef:
        """Print the draft's summary and where its file is."""
        ref = MessageRef(channel=thread.channel, ts=f"console.{next(self._ts)}")
        self._print(f"[{thread.channel} {thread.ts} thread] " + _indent(draft_text(view)))
        return ref

    async def update_draft(self, ref: MessageRef, *, view: DraftView) -> None:
        """Print the draft's new state."""
        self._print(f"[{ref.channel} {ref.ts} updated] " + _indent(draft_text(view)))


def _indent(text: str) -> str:
    first, *rest = text.splitlines() or [""]
    return "\n".join([first, *(f"    {line}" for line in rest)])


def render_root(view: IncidentView, *, page: str = "") -> str:
    """The root message as text: title, status, and the four numbers against their gates
    (``page``: the incident page's part of the first line, as the Slack message links it)."""
    status = view.status if view.source != "slash" else "on demand"
    lines = [
        f"{view.title} | {status}, {STATE_TEXT.get(view.state, view.state)} | "
        f"target {view.target or 'unknown'} | incident #{view.id}{page}"
        + (f" | acknowledged by {view.acknowledged_by}" if view.acknowledged_by else "")
    ]
    if view.summary.causes:  # the verdict leads
        lines.append(f"    {cause_text.root_line(from_summary(view.summary))}")
    headline, baseline = view.summary.headline, view.summary.baseline
    measured, normal = summary_numbers(view.summary), summary_numbers(view.summary, "normal")
    for key, label, _, _ in FOUR if headline else ():
        gate = baseline.get(key)
        suffix = f" (gate {show(key, gate[0])}, {gate[1]})" if gate else ""
        if (usual := normal.reading(key)) is not None:
            suffix += f" (normal {show_reading(key, usual)})"
        lines.append(f"    {label}: {show_reading(key, measured.reading(key))}{suffix}")
    return "\n".join(lines)
