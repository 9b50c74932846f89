"""Fakes of outside systems, at the wire: the Slack Web API; payload builders for Alertmanager."""
