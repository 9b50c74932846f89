"""Plumbing every layer may use; nothing here knows about incidents, runbooks or Slack.

tasks.py     ``TaskSupervisor``: background tasks kept until done, failures logged by id
metrics.py   the bot's own Prometheus metrics (``BotMetrics``)
ids.py       error ids, button tokens, this replica's id
access.py    access lists (Slack users and user groups): who may, named for people
sse.py       server-sent events by the spec (LF, CRLF, CR), shared by the canary and the gateway
loop.py      a coroutine run on uvloop where it is installed, else on asyncio's loop
heads.py     request heads with a ceiling and a deadline, for every uvicorn server we run
redact.py    the user info removed from a URL before it is printed
kube_client.py  a client of the Kubernetes API, for every part that reads it
defaults.py  the runbooks and seed ADR shipped inside the package
"""
