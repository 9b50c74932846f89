"""Slack's wire format, shared by every layer that writes to a thread (the Slack app sits above).

messages.py  ``MessageRef``, ``IncidentView`` and the ``Notifier`` role Slack and the console play
mrkdwn.py    escaping and clipping text for mrkdwn (no alert text becomes a live mention)
failures.py  a failed delivery and its verdict on retrying (the Slack notifier decides it)
"""
