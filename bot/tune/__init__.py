"""`ruleloop tune`: measure vLLM configurations with the canary and draft the ADR.

plan.py        what a run measures: a baseline, named experiments or a search, one canary load
space.py       the search space: per tunable flag, the values a search may give it
search.py      which flag set to measure next: a TPE search (Optuna) or the full grid
objective.py   what a search optimises, and how one trial scores against it and the gates
session.py     one search: propose, measure, score, tell, until it is done
runner.py      each configuration on a fresh local engine, the same canary each time
on_target.py   tuning on a real target: each trial's flags through its actuator, restored
records.py     a tuning session's store work on a target, each one transaction with its audit
matrix.py      measured canary reports as Metrics Matrix rows, and the recommended one
draft.py       the proposed ADR a run ends with: context, measured matrix, rules
service.py     `tune` as one call: measure, pick the best passing row, write the draft
"""
