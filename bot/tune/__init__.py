"""`ruleloop tune`: measure vLLM configurations with the canary and draft the ADR."""
