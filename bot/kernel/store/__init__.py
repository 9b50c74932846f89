"""The incident store: incidents, alerts, their Slack messages and an append-only audit log."""
