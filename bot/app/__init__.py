"""What runs: the command line, the demo, the server that composes the rooms below, its HTTP
routes and its scheduled jobs.

cli/         ``ruleloop ...``: argument parsing and printing, nothing else
demo/        ``ruleloop demo``: the whole loop replayed on a local engine
server.py    ``create_bot``: one builder per room, the ASGI app ``ruleloop serve`` runs
routes/      the HTTP endpoints (``/slack/events``, ``/alertmanager``, health, metrics)
scheduler/   the scheduled jobs: baseline canary, snapshots, reminders, drift checks, outbox sweep
"""
