"""The diagnosis: run an incident's runbook, set the four numbers against the ADR baseline."""
