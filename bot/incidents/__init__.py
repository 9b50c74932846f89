"""An incident's life in its thread: opened by an alert or /diagnose, diagnosed, reported.

    intake/      Alertmanager's webhooks in: each alert under its target's incident, deduplicated
    flows.py     alert or /diagnose -> incident -> diagnosis -> what the thread is owed
    records.py   ``IncidentRecords``: the incident rows and what each owes its thread
    outbox.py    ``Outbox``: sends an incident's messages in order, with retries and backoff
    memory.py    earlier incidents of the same cause on the target, for the thread's line
    stats.py     per ADR, what the store says happened to it (`ruleloop adr stats`)

Why an outbox: Slack can be down, answer 5xx or 429, or refuse connections while an incident
opens. What is owed is written in the same transaction as what made it owed (the webhook's, the
diagnosis's; ``bot.kernel.store.outbox``), then delivered by the in-process task at once and,
while Slack does not take it, by the scheduler's ``outbox`` job with backoff. A permanent refusal
(``channel_not_found``) ends the item ``failed`` with Slack's reason: logged, counted, audited
and shown on /healthz.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.incidents.flows import IncidentFlows as IncidentFlows

__all__ = [
    "IncidentFlows",
    "memory",
    "stats",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
