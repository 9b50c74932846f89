"""Slack's wire format, shared by every layer that writes to a thread (the Slack app sits above).

messages.py  ``MessageRef``, ``IncidentView`` and the ``Notifier`` role Slack and the console play
mrkdwn.py    escaping and clipping text for mrkdwn (no alert text becomes a live mention)
failures.py  which Slack API failures are worth retrying, and how to say the others
"""
