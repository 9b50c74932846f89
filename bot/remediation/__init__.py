"""Remediation: apply an accepted ADR's fix behind approvals and a canary gate, or roll it back.
The parts it shares with tuning on a target (actuators, flags, policy, one change at a time,
liveness) live below it in bot/change.

service.py         the flow: /apply-adr or an Apply click -> approval -> apply -> canary -> keep
                   or roll back, shown on one card in the incident's thread
run.py             one approved change, run by one runner: apply, canary, keep or roll back
records.py         the flow's store work, each one transaction with its audit entry
gateway_rules.py   an ADR's ``fix.gateway`` rules, applied through the gateway's admin endpoint
gate.py            the canary with the ADR's gates against the changed engine
live_stage.py      then, where the target asks, production traffic on the canary stage judged
                   against the baseline replicas, step by step, before it is promoted
lines.py           a change's gates and canary numbers as plain lines (card, console, page)
card.py            the one card a change shows in the thread, updated at every step
ports.py           what the flow shows, and the role that shows it (Slack or the console)
change_note.py     what an actuator that records changes for review is told about one change
silences.py        Alertmanager silences (API v2): during a change, or from a thread's button
change_silence.py  the silence of one change: made when it applies, expired when it ends
thread_buttons.py  the thread's Silence, Acknowledge and cause buttons, single-use
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.remediation.gate import GateRun as GateRun
    from bot.remediation.gate import GateRunner as GateRunner
    from bot.remediation.gate import run_gate as run_gate
    from bot.remediation.lines import NUMBER_LABELS as NUMBER_LABELS
    from bot.remediation.lines import gate_lines as gate_lines
    from bot.remediation.lines import number_lines as number_lines
    from bot.remediation.lines import value_text as value_text
    from bot.remediation.lines import verdict_lines as verdict_lines
    from bot.remediation.live_stage import LiveJudge as LiveJudge
    from bot.remediation.live_stage import live_judge as live_judge
    from bot.remediation.ports import STATES as STATES
    from bot.remediation.ports import RemediationNotifier as RemediationNotifier
    from bot.remediation.ports import RemediationView as RemediationView
    from bot.remediation.records import SUBJECT as SUBJECT
    from bot.remediation.service import RemediationService as RemediationService
    from bot.remediation.thread_buttons import ThreadButtons as ThreadButtons

__all__ = [
    "GateRun",
    "GateRunner",
    "LiveJudge",
    "NUMBER_LABELS",
    "RemediationNotifier",
    "RemediationService",
    "RemediationView",
    "STATES",
    "SUBJECT",
    "ThreadButtons",
    "gate_lines",
    "live_judge",
    "number_lines",
    "run_gate",
    "value_text",
    "verdict_lines",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
