"""Changing a target's engine: what every kind of change (a remediation, bot/remediation; a
tuning session, bot/tune/on_target.py; a drift before-run, bot/app/scheduler/before_run.py) uses to
set flags, hold the target, and check it still serves. Every change is a row of one table,
``changes`` (bot.kernel.store.models.Change, its ``kind`` saying which).

actuators/         where the flags are changed: local engine, Kubernetes Deployment, a commit
                   to the deployment repository (git), dry run
gitops/            changes that land as commits in a team's repository: git, pull requests
argv.py            reading and rewriting vLLM flags inside a command line
policy.py          who may request and approve; which ADRs and flags are allowed
exclusion.py       one change at a time per target, and the refusal naming who holds it
in_force.py        which ADRs are in force on a target: what the scheduled checks check, and
                   the standing gates a change there is watched against
rows.py            what the records of every kind share: one heartbeat, staleness, who holds
resume.py          one resume path: every silent change, of any kind, to its kind's restorer
liveness.py        which run owns a change, and how it shows it is alive
serving.py         after a change or a restore: the engine serves a completion, not just /health
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.change.argv import diff as diff
    from bot.change.argv import flags_text as flags_text
    from bot.change.argv import merge as merge
    from bot.change.argv import with_flags as with_flags
    from bot.change.exclusion import Holder as Holder
    from bot.change.exclusion import TargetBusy as TargetBusy
    from bot.change.exclusion import refusal as refusal
    from bot.change.exclusion import tuning_refusal as tuning_refusal
    from bot.change.in_force import InForce as InForce
    from bot.change.in_force import adrs_in_force as adrs_in_force
    from bot.change.in_force import in_force_of as in_force_of
    from bot.change.liveness import Beat as Beat
    from bot.change.liveness import LostRun as LostRun
    from bot.change.liveness import Sleep as Sleep
    from bot.change.liveness import beating as beating
    from bot.change.liveness import owned as owned
    from bot.change.policy import Policy as Policy
    from bot.change.resume import Restorer as Restorer
    from bot.change.serving import verify_serving as verify_serving

__all__ = [
    "Beat",
    "Holder",
    "InForce",
    "LostRun",
    "Policy",
    "Restorer",
    "Sleep",
    "TargetBusy",
    "adrs_in_force",
    "beating",
    "diff",
    "exclusion",
    "flags_text",
    "in_force_of",
    "merge",
    "owned",
    "refusal",
    "resume",
    "rows",
    "tuning_refusal",
    "verify_serving",
    "with_flags",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
