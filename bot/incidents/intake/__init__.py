"""Alertmanager intake: the webhook's payload model and the deduplicating incident service."""
