"""The canary: a streaming load generator that measures the four metrics and checks ADR gates."""
