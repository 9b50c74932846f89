"""`ruleloop tune`: measure vLLM configurations with the canary and draft the ADR.

plan.py        what a run measures: a baseline, named experiments or a search, one canary load
space.py       the search space: per tunable flag, the values a search may give it
search.py      which flag set to measure next: a TPE search (Optuna) or the full grid
objective.py   what a search optimises, and how one trial scores against it and the gates
session.py     one search: propose, measure, score, tell, until it is done
runner.py      each configuration on a fresh local engine, the same canary each time
on_target.py   tuning on a real target: each trial's flags through its actuator, restored
records.py     a tuning session's store work on a target, each one transaction with its audit
retune.py      a rule that failed on the live workload: a search on the target offered, run
matrix.py      measured canary reports as Metrics Matrix rows, and the recommended one
draft.py       the proposed ADR a run ends with: context, measured matrix, rules
service.py     `tune` as one call: measure, pick the best passing row, write the draft
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.tune.objective import METRICS as METRICS
    from bot.tune.on_target import RestoreFailed as RestoreFailed
    from bot.tune.on_target import SessionRestorer as SessionRestorer
    from bot.tune.on_target import approve as approve
    from bot.tune.on_target import capture_shape as capture_shape
    from bot.tune.on_target import check_target as check_target
    from bot.tune.on_target import finish as finish
    from bot.tune.on_target import restore_target_session as restore_target_session
    from bot.tune.on_target import tune_target as tune_target
    from bot.tune.on_target import utc_now as utc_now
    from bot.tune.plan import Experiment as Experiment
    from bot.tune.plan import TunePlan as TunePlan
    from bot.tune.plan import WorkloadSpec as WorkloadSpec
    from bot.tune.plan import load_plan as load_plan
    from bot.tune.records import TuneRecords as TuneRecords
    from bot.tune.retune import ENDED as ENDED
    from bot.tune.retune import OFFERED as OFFERED
    from bot.tune.retune import Offer as Offer
    from bot.tune.retune import Retune as Retune
    from bot.tune.retune import space_of as space_of
    from bot.tune.runner import Echo as Echo
    from bot.tune.service import DraftPlace as DraftPlace
    from bot.tune.service import TuneResult as TuneResult
    from bot.tune.service import run_tune as run_tune
    from bot.tune.service import write_search_draft as write_search_draft
    from bot.tune.space import parse_dimension as parse_dimension

__all__ = [
    "DraftPlace",
    "Echo",
    "Experiment",
    "METRICS",
    "ENDED",
    "OFFERED",
    "Offer",
    "RestoreFailed",
    "Retune",
    "SessionRestorer",
    "TunePlan",
    "TuneRecords",
    "TuneResult",
    "WorkloadSpec",
    "approve",
    "capture_shape",
    "check_target",
    "finish",
    "load_plan",
    "parse_dimension",
    "restore_target_session",
    "space_of",
    "run_tune",
    "tune_target",
    "utc_now",
    "write_search_draft",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
