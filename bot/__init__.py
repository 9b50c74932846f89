"""ruleloop: incident-response ChatOps for vLLM inference fleets."""

__version__ = "0.1.0"
