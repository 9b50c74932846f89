"""The outbox: each Slack message the bot owes an incident, stored with it, sent until it lands.

    items.py      store operations on one session: owe, claim, finish, re-arm, count
    delivery.py   ``Outbox``: sends an incident's messages in order, with retries and backoff

Why: Slack can be down, answer 5xx or 429, or refuse connections while an incident opens. What
is owed is written in the same transaction as what made it owed (the webhook's, the
diagnosis's), then delivered by the in-process task at once and, while Slack does not take it,
by the scheduler's ``outbox`` job with backoff. A permanent refusal (``channel_not_found``)
ends the item ``failed`` with Slack's reason: logged, counted, audited and shown on /healthz.
"""
