"""The Slack surface: bolt app, listeners, Block Kit views, the Slack or console notifier, and
the one boundary where a Slack error is judged (failures.py)."""
