"""Runbooks: YAML files that say which probes run for which alerts and what becomes a finding."""
