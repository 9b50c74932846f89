"""`python -m latency_checker`: the seed's CI canary gate, backed by ruleloop's canary."""
