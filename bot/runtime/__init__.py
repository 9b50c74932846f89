"""Plumbing every layer may use; nothing here knows about incidents, runbooks or Slack.

tasks.py     ``TaskSupervisor``: background tasks kept until done, failures logged by id
metrics.py   the bot's own Prometheus metrics (``BotMetrics``)
ids.py       error ids, button tokens, this replica's id
access.py    access lists (Slack users and user groups): who may, named for people
sse.py       server-sent events by the spec (LF, CRLF, CR), shared by the canary and the gateway
"""
