"""ADRs as code: the record model, parser, renderer, validator, matcher and store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.adr.causes import Cause as Cause
    from bot.adr.causes import Verdict as Verdict
    from bot.adr.causes import known as known
    from bot.adr.flags import TUNABLE as TUNABLE
    from bot.adr.flags import EngineArgs as EngineArgs
    from bot.adr.flags import canonical as canonical
    from bot.adr.flags import check_engine_args as check_engine_args
    from bot.adr.flags import parse_flags as parse_flags
    from bot.adr.flags import to_argv as to_argv
    from bot.adr.match import MatchResult as MatchResult
    from bot.adr.match import by_cause as by_cause
    from bot.adr.match import by_workload as by_workload
    from bot.adr.match import matching as matching
    from bot.adr.match import read_metric as read_metric
    from bot.adr.match import read_report as read_report
    from bot.adr.metrics import METRICS as METRICS
    from bot.adr.models import GATE_METRICS as GATE_METRICS
    from bot.adr.models import Adr as Adr
    from bot.adr.models import AdrGates as AdrGates
    from bot.adr.models import Condition as Condition
    from bot.adr.models import EngineValue as EngineValue
    from bot.adr.models import Fix as Fix
    from bot.adr.models import GatewayRules as GatewayRules
    from bot.adr.models import MatrixRow as MatrixRow
    from bot.adr.models import Status as Status
    from bot.adr.parse import date_of_id as date_of_id
    from bot.adr.parse import load as load
    from bot.adr.relative import BEFORE as BEFORE
    from bot.adr.relative import NORMAL as NORMAL
    from bot.adr.relative import NORMAL_METRICS as NORMAL_METRICS
    from bot.adr.relative import Normal as Normal
    from bot.adr.relative import Relative as Relative
    from bot.adr.relative import unlike_gate as unlike_gate
    from bot.adr.render import format_ms as format_ms
    from bot.adr.render import format_pct as format_pct
    from bot.adr.shared import SharedAdrStore as SharedAdrStore
    from bot.adr.store import AdrStore as AdrStore
    from bot.adr.store import file_id as file_id
    from bot.adr.store import slugify as slugify
    from bot.adr.validate import check_record as check_record
    from bot.adr.validate import default_checker as default_checker

__all__ = [
    "Adr",
    "AdrGates",
    "AdrStore",
    "BEFORE",
    "Cause",
    "Condition",
    "EngineArgs",
    "EngineValue",
    "Fix",
    "GATE_METRICS",
    "GatewayRules",
    "METRICS",
    "MatchResult",
    "MatrixRow",
    "NORMAL",
    "NORMAL_METRICS",
    "Normal",
    "Relative",
    "SharedAdrStore",
    "Status",
    "TUNABLE",
    "Verdict",
    "by_cause",
    "by_workload",
    "canonical",
    "causes",
    "check_engine_args",
    "check_record",
    "date_of_id",
    "default_checker",
    "file_id",
    "format_ms",
    "format_pct",
    "known",
    "load",
    "match",
    "matching",
    "parse_flags",
    "read_metric",
    "read_report",
    "render",
    "slugify",
    "to_argv",
    "unlike_gate",
    "validate",
    "vllm_args",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
