"""Changing a target's engine: what the apply flow (bot/remediation) and tuning on a target
(bot/tune/on_target.py) both use to set flags, hold the target, and check it still serves.

actuators/         where the flags are changed: local engine, Kubernetes Deployment, a commit
                   to the deployment repository (git), dry run
argv.py            reading and rewriting vLLM flags inside a command line
policy.py          who may request and approve; which ADRs and flags are allowed
exclusion.py       one change at a time per target, and the refusal naming who holds it
liveness.py        which run owns a change, and how it shows it is alive
serving.py         after a change or a restore: the engine serves a completion, not just /health
"""
