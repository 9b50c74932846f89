"""Block Kit views of the remediation card and the ADR draft, and their console text.

The card is one message, updated in place at every step: the exact flag diff and the gates
first (what is being approved), then where it stands, then the numbers and the verdict.
In the Block Kit views, ADR text, flag values, canary failures and notes (which quote error
bodies) go through ``bot.kernel.chat.mrkdwn``; only the mentions of the people who acted stay live.
The console text is the same wording, unescaped.
"""

from __future__ import annotations

from typing import Any

from slack_sdk.models.blocks import (
    ActionsBlock,
    Block,
    ButtonElement,
    ContextBlock,
    HeaderBlock,
    MarkdownTextObject,
    SectionBlock,
)

from bot.kernel.chat import clip, escape_keeping, mention, plain
from bot.kernel.store import ChangeState as S
from bot.postmortem import DraftView
from bot.remediation import (
    NUMBER_LABELS,
    STATES,
    RemediationView,
    gate_lines,
    number_lines,
    value_text,
)

SECTION = 3000  # the most a section's text may hold

# approve / cancel a request; keep / roll back a held change (its canary could not decide)
DECIDE_ACTIONS = (
    "remediation_approve", "remediation_deny", "remediation_keep", "remediation_roll_back",
)  # fmt: skip
REVIEW_ACTIONS = ("adr_draft_accept", "adr_draft_reject")
STATE_MARK: dict[str, str] = {  # keyed by the enum; a state read back as text finds it
    S.PROMOTED: ":white_check_mark:",
    S.ROLLED_BACK: ":leftwards_arrow_with_hook:",
    S.FAILED: ":rotating_light:",
    S.CANCELLED: ":no_entry_sign:",
    S.EXPIRED: ":hourglass:",
    S.DRY_RUN: ":memo:",
    S.HELD: ":double_vertical_bar:",
}


def _yes_no(yes: tuple[str, str, str], no: tuple[str, str, str]) -> ActionsBlock:
    """A primary and a danger button: (label, action_id, single-use token) each."""
    return ActionsBlock(
        elements=[
            ButtonElement(text=text, action_id=action_id, value=value, style=style)
            for (text, action_id, value), style in ((yes, "primary"), (no, "danger"))
        ]
    )


def _flag(value: object) -> str:
    if value is None:
        return "(unset)"
    if value is True:
        return "on"
    if value is False:
        return "off"
    return str(value)


def diff_lines(view: RemediationView) -> list[str]:
    """'--max-num-batched-tokens: 8192 → 2048' per changed flag, then 'gateway: key = value'."""
    return [f"--{name}: {_flag(old)} → {_flag(new)}" for name, old, new in view.diff] + [
        f"gateway: {key} = {_flag(value)}" for key, value in view.gateway.items()
    ]


def card_text(view: RemediationView) -> str:
    """The card as plain text (notification text, and the console)."""
    mark = STATE_MARK.get(view.state, ":gear:")
    lines = [
        f"{mark} {view.adr_id} on {view.target}: {STATES.get(view.state, view.state)}",
        f"requested by {mention(view.requested_by)} · actuator {view.actuator}"
        + (" · two-person rule" if view.two_person else ""),
        "flags: " + "; ".join(diff_lines(view)),
        "gates: " + ("; ".join(gate_lines(view.gates, view.relative_gates)) or "none"),
    ]
    if view.approved_by:
        lines.append("approved by " + ", ".join(f"{mention(u)}" for u in view.approved_by))
    if view.numbers:
        lines.append("canary: " + "; ".join(number_lines(view.numbers, view.before_numbers)))
    if view.how_sure:
        lines.append("how sure: " + "; ".join(view.how_sure))
    if view.watched:
        lines.append("watched, not gated: " + "; ".join(view.watched))
    if view.live:
        lines.append("live stage: " + "; ".join(view.live))
    if view.failures:
        lines.append("failed gates: " + "; ".join(view.failures))
    if view.silence:
        lines.append(view.silence)
    if view.note:
        lines.append(view.note)
    if view.state == S.PENDING and view.expires_at is not None:
        lines.append(f"buttons expire at {view.expires_at:%H:%M} UTC")
    if view.state == S.HELD and view.expires_at is not None:
        lines.append(f"rolled back at {view.expires_at:%H:%M} UTC unless someone keeps it")
    return "\n".join(lines)


def card_update_text(view: RemediationView) -> str:
    """What changed on the card: its state, the note, the numbers once there are some."""
    mark = STATE_MARK.get(view.state, ":gear:")
    lines = [f"{mark} {view.adr_id} on {view.target}: {STATES.get(view.state, view.state)}"]
    if view.note:
        lines.append(view.note)
    if view.silence:
        lines.append(view.silence)
    if view.numbers and view.state in (S.PROMOTING, S.PROMOTED, S.ROLLED_BACK, S.FAILED):
        if view.relative_gates:  # resolved by the before-run: the limits the canary was held to
            lines.append("gates: " + "; ".join(gate_lines(view.gates, view.relative_gates)))
        lines.append("canary: " + "; ".join(number_lines(view.numbers, view.before_numbers)))
        if view.how_sure:
            lines.append("how sure: " + "; ".join(view.how_sure))
        if view.watched:
            lines.append("watched, not gated: " + "; ".join(view.watched))
    if view.live:
        lines.append("live stage: " + "; ".join(view.live))
    return "\n".join(lines)


def remediation_card(view: RemediationView) -> tuple[str, list[dict[str, Any]]]:
    """The card's blocks: header, diff, gates, state, numbers, and the buttons while pending."""
    mark = STATE_MARK.get(view.state, ":gear:")
    summary = plain(f"{view.adr_id} on {view.target}: {STATES.get(view.state, view.state)}", 300)
    title = f"*{plain(view.adr_title, 500)}*\n" if view.adr_title else ""
    diff = clip(plain("\n".join(diff_lines(view))), SECTION - len(title) - 40)
    blocks: list[Block] = [
        HeaderBlock(text=f"Apply {view.adr_id} to {view.target}"[:150]),  # plain text
        SectionBlock(
            text=MarkdownTextObject(text=f"{title}*Flag changes* (only these):\n```{diff}```"),
        ),
        SectionBlock(
            text=MarkdownTextObject(
                text="*Canary gates* (all must hold, else automatic rollback):\n"
                + (
                    "\n".join(f"• {plain(g)}" for g in gate_lines(view.gates, view.relative_gates))
                    or "none"
                )
            )
        ),
        SectionBlock(text=MarkdownTextObject(text=clip(f"{mark} *{summary}*", SECTION))),
    ]
    people = [view.requested_by, *view.approved_by]
    details = []
    if view.numbers:
        details.append("*Canary:* " + " · ".join(number_lines(view.numbers, view.before_numbers)))
    if view.how_sure:  # each per-request gate as its statistics decided it
        details.append("*How sure:* " + " · ".join(view.how_sure))
    if view.watched:  # ungated numbers the change made worse (guardrails)
        details.append("*Watched, not gated:* " + plain(" · ".join(view.watched)))
    if view.live:  # production traffic on the canary stage, step by step
        details.append("*Live stage:* " + plain(" · ".join(view.live)))
    if view.failures:
        details.append("*Failed gates:* " + plain("; ".join(view.failures)))
    if view.silence:
        details.append("*Silence:* " + plain(view.silence))
    if view.note:  # the bot's words, quoting error text; "approved by <@U..>" stays a mention
        details.append(escape_keeping(view.note, people))
    if details:
        blocks.append(SectionBlock(text=MarkdownTextObject(text=clip("\n".join(details), SECTION))))
    who = f"Requested by {mention(view.requested_by)} · actuator `{plain(view.actuator, 100)}`"
    if view.two_person:
        who += " · two-person rule: the approver must be someone else"
    if view.approved_by:
        who += " · approved by " + ", ".join(f"{mention(u)}" for u in view.approved_by)
    if view.state == S.PENDING and view.expires_at is not None:
        who += f" · buttons expire {view.expires_at:%H:%M} UTC"
    if view.state == S.HELD and view.expires_at is not None:
        who += f" · rolled back at {view.expires_at:%H:%M} UTC unless someone keeps it"
    blocks.append(ContextBlock(elements=[MarkdownTextObject(text=clip(who, SECTION))]))
    blocks.extend(_card_buttons(view))
    return summary, [b.to_dict() for b in blocks]


def _card_buttons(view: RemediationView) -> list[ActionsBlock]:
    """Approve / Cancel on a pending request, Keep / Roll back on a held change."""
    if not view.tokens:
        return []
    if view.state == S.PENDING:
        yes, no = ("Approve and apply", "approve"), ("Cancel", "deny")
        actions = DECIDE_ACTIONS[:2]
    elif view.state == S.HELD:
        yes, no = ("Keep the change", "keep"), ("Roll back", "roll_back")
        actions = DECIDE_ACTIONS[2:]
    else:
        return []
    return [
        _yes_no((yes[0], actions[0], view.tokens[yes[1]]), (no[0], actions[1], view.tokens[no[1]]))
    ]


def matrix_lines(view: DraftView) -> list[str]:
    """The Metrics Matrix rows as short lines."""
    out = []
    for row in view.matrix:
        numbers = " · ".join(
            f"{label} {value_text(row.get(key), unit)}"
            for key, (label, unit) in NUMBER_LABELS.items()
        )
        out.append(
            f"{row['config']}: {numbers}" + (f" → {row['verdict']}" if row["verdict"] else "")
        )
    return out


def draft_text(view: DraftView) -> str:
    """The draft's summary as plain text."""
    lines = [f"ADR draft {view.adr_id} ({view.state}): {view.title}", *matrix_lines(view)]
    lines.append(f"file: {view.path}")
    if view.reviewed_by:
        lines.append(f"{view.state} by {mention(view.reviewed_by)}")
    if view.note:
        lines.append(view.note)
    return "\n".join(lines)


def draft_message(view: DraftView) -> tuple[str, list[dict[str, Any]]]:
    """The draft's summary with Accept / Reject while it is proposed."""
    text = plain(f"Post-incident ADR draft {view.adr_id}: {view.title}", 1000)
    rows = "\n".join(f"• {plain(line)}" for line in matrix_lines(view)) or "no measurements"
    reviewers = (
        "anyone" if "*" in view.reviewers else ", ".join(f"{mention(u)}" for u in view.reviewers)
    ) or "nobody yet (set [access] review)"
    blocks: list[Block] = [
        SectionBlock(text=MarkdownTextObject(text=clip(f"*{text}*", SECTION))),
        SectionBlock(text=MarkdownTextObject(text=clip(f"*Metrics Matrix*\n{rows}", SECTION))),
        ContextBlock(
            elements=[
                MarkdownTextObject(
                    text=clip(
                        f"State: *{view.state}* · file `{plain(view.path)}` · author "
                        f"{mention(view.author)} · reviewers: {reviewers} (not the author)",
                        SECTION,
                    )
                )
            ]
        ),
    ]
    if view.reviewed_by:
        note = escape_keeping(view.note, [view.author, view.reviewed_by])
        decided = f"{view.state.capitalize()} by {mention(view.reviewed_by)}. {note}"
        blocks.append(SectionBlock(text=MarkdownTextObject(text=clip(decided, SECTION))))
    if view.state == "proposed" and view.tokens:
        blocks.append(
            _yes_no(
                ("Accept", REVIEW_ACTIONS[0], view.tokens["accept"]),
                ("Reject", REVIEW_ACTIONS[1], view.tokens["reject"]),
            )
        )
    return text, [b.to_dict() for b in blocks]
