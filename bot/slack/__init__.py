"""The Slack surface: bolt app, listeners, Block Kit views, and the Slack or console notifier."""
