"""Remediation: apply an accepted ADR's fix behind approvals and a canary gate, or roll it back.

policy.py      who may request and approve; which ADRs and flags are allowed
argv.py        reading and rewriting vLLM flags inside a command line
actuators/     where the flags are changed: local engine, Kubernetes Deployment, dry run
gate.py        the canary with the ADR's gates against the changed engine
service.py     the flow: request -> approvals -> apply -> canary -> keep or roll back
"""
