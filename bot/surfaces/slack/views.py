"""Block Kit views and the prose they carry (kept together so the wording can be read as a whole).

Built with ``slack_sdk.models.blocks``, whose ``to_dict`` refuses what Slack would reject
(lengths, counts) before anything is sent. Text the bot does not write (labels, finding messages,
ADR text, target and runbook names) goes through ``bot.kernel.chat.mrkdwn`` on its way in, and every
line is clipped so that one long value cannot make a whole message unpostable.
"""

from __future__ import annotations

import json
from typing import Any

from slack_sdk.models.blocks import (
    ActionsBlock,
    Block,
    ButtonElement,
    ContextBlock,
    DividerBlock,
    HeaderBlock,
    MarkdownTextObject,
    SectionBlock,
)

from bot.adr import MatchResult
from bot.diagnosis import (
    CauseVerdict,
    Diagnosis,
    cause_text,
    from_summary,
    replica_text,
    summary_numbers,
)
from bot.diagnosis.probes import Finding, Severity
from bot.kernel.chat import (
    ACKNOWLEDGE,
    CAUSE_CONFIRMED,
    CAUSE_WRONG,
    RETUNE,
    SILENCE,
    IncidentView,
    clip,
    escape,
    mention,
    plain,
)
from bot.kernel.numbers import FOUR, Reading, compare, show, show_reading
from bot.kernel.store import DiagnosisSummary

APPLY_ACTION = "apply_adr"
# token kind -> (label, action_id) of the incident thread's buttons
THREAD_BUTTONS = {
    SILENCE: ("Silence 1h", "incident_silence"),
    ACKNOWLEDGE: ("Acknowledge", "incident_acknowledge"),
    CAUSE_CONFIRMED: ("Cause confirmed", "incident_cause_confirmed"),
    CAUSE_WRONG: ("Wrong cause", "incident_cause_wrong"),
    RETUNE: ("Re-tune on the live traffic", "incident_retune"),
}
THREAD_ACTIONS = tuple(action_id for _, action_id in THREAD_BUTTONS.values())
MAX_FINDINGS = 15
MAX_LINE = 1000  # one finding or ADR line; a section holds 3000 characters
MAX_SECTION = 2900
SEVERITY_MARK = {
    Severity.CRITICAL: ":red_circle:",
    Severity.WARNING: ":large_orange_circle:",
    Severity.INFO: ":information_source:",
}
STATE_TEXT = {
    "diagnosing": "diagnosing…",
    "diagnosed": "diagnosed (details in the thread)",
    "failed": "diagnosis failed (see the thread)",
    "waiting": "no diagnosis",
}
NORMAL_NOTE = " *normal*: the median of the scheduler's recent snapshots of this target."
NO_MATCH = (
    "No accepted ADR matches these numbers. When this incident is fixed, record the fix "
    "(`ruleloop tune` drafts the ADR from measured numbers) so the next one has a rule."
)


def _number_field(key: str, label: str, summary: DiagnosisSummary) -> MarkdownTextObject:
    reading = summary_numbers(summary).reading(key)
    limit = summary.baseline.get(key)
    text = f"*{label}*\n{show_reading(key, reading)}"
    if limit is not None:
        worse_up = next(w for k, _, _, w in FOUR if k == key)
        edge, adr = limit
        ok = (
            None if reading is None else compare(reading, "<=" if worse_up else ">=", Reading(edge))
        )
        mark = "" if ok is None else (" :white_check_mark:" if ok else " :x:")
        text += f"{mark}  (gate {'≤' if worse_up else '≥'} {show(key, edge)}, {plain(adr, 100)})"
    normal = summary_numbers(summary, "normal").reading(key)
    if normal is not None:
        text += f"\nnormal {show_reading(key, normal)}"
    return MarkdownTextObject(text=text)


def page_link(url: str | None) -> str:
    """' · <url|incident page>' (mrkdwn; the URL's & as an entity), or '' without a URL."""
    return f" · <{escape(url)}|incident page>" if url else ""


def root_message(
    view: IncidentView, *, page_url: str | None = None
) -> tuple[str, list[dict[str, Any]]]:
    """The incident's root message: status and the four numbers against the baseline."""
    alerted = view.source != "slash"  # Alertmanager, or the scheduler's baseline canary
    resolved = view.status == "resolved" and alerted
    mark = (
        ":white_check_mark: Resolved:"
        if resolved
        else (":mag:" if view.source == "slash" else ":rotating_light:")
    )
    title = f"{mark} {view.title}"[:150]  # a header is plain text: shown, never parsed
    status = "resolved" if resolved else ("firing" if alerted else "on demand")
    target = plain(view.target or "unknown", 200)
    line = (
        f"*Status:* {status} · {STATE_TEXT.get(view.state, view.state)}   "
        f"*Target:* {target}   "
        f"*Incident* #{view.id} · opened {view.opened_at:%Y-%m-%d %H:%M} UTC" + page_link(page_url)
    )
    if view.requested_by:
        line += f"   *Requested by* {mention(view.requested_by)}"
    if resolved and view.closed_at:
        line += f" · resolved {view.closed_at:%H:%M} UTC"
    if view.acknowledged_by:
        line += f" · acknowledged by <@{plain(view.acknowledged_by, 64)}>"
    blocks: list[Block] = [
        HeaderBlock(text=title),
        SectionBlock(text=MarkdownTextObject(text=line)),
    ]
    if view.summary.causes:  # the verdict leads: the likely cause and its one number
        verdict = cause_text.root_line(from_summary(view.summary))
        blocks.append(SectionBlock(text=MarkdownTextObject(text=f"*{plain(verdict, MAX_LINE)}*")))
    if view.summary.diagnosed:
        fields = [_number_field(key, label, view.summary) for key, label, _, _ in FOUR]
        blocks.append(SectionBlock(fields=fields))
        blocks.append(
            ContextBlock(
                elements=[
                    MarkdownTextObject(
                        text=(
                            "Engine-side numbers over the sampling window (runbook "
                            f"`{plain(view.summary.runbook, 200)}`); gates from the "
                            "accepted ADRs. "
                            "An estimate shows its span in brackets (KV fragmentation from "
                            "the engine's gauges); a canary measures it exactly."
                            + (NORMAL_NOTE if view.summary.normal else "")
                        )
                    )
                ]
            )
        )
    fleet = view.summary.replicas
    if fleet and fleet.line:  # one replica or all of them, on a phone's first screen
        text = clip(plain(fleet.line), MAX_LINE)
        blocks.append(ContextBlock(elements=[MarkdownTextObject(text=text)]))
    text = f"{plain(title)} · {status} · target {target}"  # notifications parse this text
    return text, [b.to_dict() for b in blocks]


def finding_line(finding: Finding) -> str:
    """One finding as a bullet (mrkdwn: its message and source escaped, the line clipped)."""
    text = f"{plain(finding.message)}  _({plain(finding.source, 200)})_"
    return clip(f"{SEVERITY_MARK[finding.severity]} {text}", MAX_LINE)


def findings_message(
    diagnosis: Diagnosis, *, page_url: str | None = None
) -> tuple[str, list[dict[str, Any]]]:
    """The findings, worst first, in the thread (with the incident page's link, if given)."""
    shown = diagnosis.findings[:MAX_FINDINGS]
    lines = [finding_line(f) for f in shown] or [
        ":white_check_mark: No finding: every reading is within its runbook limits."
    ]
    if len(diagnosis.findings) > MAX_FINDINGS:
        lines.append(f"…and {len(diagnosis.findings) - MAX_FINDINGS} more (see the audit log).")
    head = (
        f"*Findings* on *{plain(diagnosis.target, 200)}* "
        f"(runbook `{plain(diagnosis.runbook, 200)}`, {diagnosis.sampling_s:.0f} s window)"
        + page_link(page_url)
    )
    blocks: list[Block] = [SectionBlock(text=MarkdownTextObject(text=head))]
    if diagnosis.replicas is not None:  # one line, as short for 40 replicas as for 2
        line = plain(replica_text.line(diagnosis.replicas), MAX_LINE)
        blocks.append(ContextBlock(elements=[MarkdownTextObject(text=line)]))
    blocks += cause_blocks(diagnosis.causes)
    chunk: list[str] = []
    for line in lines:  # one section holds at most 3000 characters
        if chunk and sum(len(x) + 1 for x in chunk) + len(line) > MAX_SECTION:
            blocks.append(SectionBlock(text=MarkdownTextObject(text="\n".join(chunk))))
            chunk = []
        chunk.append(line)
    blocks.append(SectionBlock(text=MarkdownTextObject(text="\n".join(chunk))))
    verdict = cause_text.root_line(diagnosis.causes)
    count = f"{len(diagnosis.findings)} finding(s) on {plain(diagnosis.target, 200)}"
    return f"{plain(verdict, MAX_LINE)} · {count}", [b.to_dict() for b in blocks]


def cause_blocks(verdicts: list[CauseVerdict]) -> list[Block]:
    """The causes before the findings: supported ones with their evidence, then what was ruled
    out with its number, then what could not be told and the data gaps (none without causes)."""
    if not verdicts:
        return []
    part = cause_text.lines(verdicts)
    top = [f"*{plain(cause_text.root_line(verdicts))}*"]
    top += [f":mag: *{plain(t)}*: {plain(e)}" for t, e in part.supported]
    top += [f":heavy_minus_sign: ruled out: {plain(t)} ({plain(n)})" for t, n in part.ruled_out]
    small = [f"cannot tell: {plain(t)} ({plain(why)})" for t, why in part.undecided]
    small += [f"data gap: {plain(gap)}" for gap in part.gaps]
    blocks: list[Block] = [
        SectionBlock(text=MarkdownTextObject(text=clip("\n".join(top), MAX_SECTION)))
    ]
    if small:
        blocks.append(
            ContextBlock(elements=[MarkdownTextObject(text=clip("\n".join(small), MAX_SECTION))])
        )
    return blocks


def withheld_text(diagnosis: Diagnosis) -> str | None:
    """Why the ADRs that matched are not offered (a slow replica, not the fleet), and what to
    do instead; None when none was held back."""
    if not diagnosis.withheld or diagnosis.replicas is None:
        return None
    ids = ", ".join(m.adr.id for m in diagnosis.withheld)
    slow = diagnosis.replicas.slow
    which = "one replica is" if len(slow) == 1 else f"{len(slow)} replicas are"
    whose = "its" if len(diagnosis.withheld) == 1 else "their"
    return (
        f"Not offered: {ids} ({whose} conditions hold on the fleet's merged numbers, but {which} "
        f"the slow one{'s' if len(slow) > 1 else ''}: a fleet-wide flag change is not the fix). "
        f"By hand: {replica_text.by_hand(diagnosis.replicas)}."
    )


def adr_message(
    matches: list[MatchResult], *, incident_id: int, target: str, withheld: str | None = None
) -> tuple[str, list[dict[str, Any]]]:
    """The accepted ADRs whose `match` holds, each with an Apply button (``withheld``: why
    the ones that matched are not offered)."""
    if withheld is not None:
        text = clip(plain(withheld), MAX_SECTION)
        return text, [SectionBlock(text=MarkdownTextObject(text=text)).to_dict()]
    if not matches:
        return NO_MATCH, [SectionBlock(text=MarkdownTextObject(text=NO_MATCH)).to_dict()]
    blocks: list[Block] = [
        SectionBlock(text=MarkdownTextObject(text="*Accepted ADRs whose conditions hold*"))
    ]
    for result in matches[:10]:
        adr = result.adr
        why = clip(plain("; ".join(c.explain() for c in result.conditions)), MAX_LINE)
        value = json.dumps({"adr": adr.id, "incident": incident_id, "target": target})
        answers = f" _(answers {plain(', '.join(adr.cause), 200)})_" if adr.cause else ""
        head = clip(f"*{plain(adr.id, 100)}*: {plain(adr.title)}{answers}", MAX_LINE)
        blocks.append(
            SectionBlock(
                text=MarkdownTextObject(text=f"{head}\n{why}"),
                accessory=ButtonElement(
                    text="Apply", action_id=APPLY_ACTION, value=value, style="primary"
                ),
            )
        )
        blocks.append(DividerBlock())
    ids = ", ".join(plain(m.adr.id, 100) for m in matches)
    return f"Matching accepted ADRs: {ids}", [b.to_dict() for b in blocks[:-1]]


def thread_buttons_message(
    tokens: dict[str, str], *, note: str | None = None
) -> tuple[str, list[dict[str, Any]]]:
    """The incident's Silence / Acknowledge buttons (single-use tokens as their values), with
    ``note`` (mrkdwn the bot wrote) above them."""
    shown = [kind for kind in THREAD_BUTTONS if kind in tokens]
    blocks: list[Block] = []
    if note:
        blocks.append(SectionBlock(text=MarkdownTextObject(text=clip(note, MAX_SECTION))))
    blocks.append(
        ActionsBlock(
            elements=[
                ButtonElement(text=THREAD_BUTTONS[kind][0], action_id=THREAD_BUTTONS[kind][1],
                              value=tokens[kind])
                for kind in shown
            ]
        )
    )  # fmt: skip
    text = note or " / ".join(THREAD_BUTTONS[kind][0] for kind in shown)
    return text, [b.to_dict() for b in blocks]
