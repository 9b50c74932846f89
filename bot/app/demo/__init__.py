"""`ruleloop demo`: the article's incident in miniature on the local CPU engine (scenario.py)."""
