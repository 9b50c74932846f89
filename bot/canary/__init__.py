"""The canary: a streaming load generator that measures the four metrics and checks ADR gates."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.canary.client import Outcome as Outcome
    from bot.canary.client import RequestRecord as RequestRecord
    from bot.canary.client import stream_tokens as stream_tokens
    from bot.canary.guardrails import Guardrail as Guardrail
    from bot.canary.guardrails import StandingGate as StandingGate
    from bot.canary.guardrails import standing as standing
    from bot.canary.guardrails import watch as watch
    from bot.canary.limits import judged_limits as judged_limits
    from bot.canary.live import ALPHA as ALPHA
    from bot.canary.live import INTERVAL_S as INTERVAL_S
    from bot.canary.live import MIN_REQUESTS as MIN_REQUESTS
    from bot.canary.live import MIN_WORSE as MIN_WORSE
    from bot.canary.live import LiveVerdict as LiveVerdict
    from bot.canary.live import analyse as analyse
    from bot.canary.measure import measure_async as measure_async
    from bot.canary.render import progress_line as progress_line
    from bot.canary.render import summary_table as summary_table
    from bot.canary.runner import METRICS_PATHS as METRICS_PATHS
    from bot.canary.runner import CanaryRun as CanaryRun
    from bot.canary.runner import Progress as Progress
    from bot.canary.schema import CanaryReport as CanaryReport
    from bot.canary.schema import Samples as Samples
    from bot.canary.schema import Spread as Spread
    from bot.canary.shape_replay import default_cap as default_cap
    from bot.canary.stats import DEFAULT_CONFIDENCE as DEFAULT_CONFIDENCE
    from bot.canary.verdict import DEFAULT_LOOKS as DEFAULT_LOOKS
    from bot.canary.verdict import DEFAULT_MAX_ERROR_RATE as DEFAULT_MAX_ERROR_RATE
    from bot.canary.verdict import FRAGMENTATION_SOURCES as FRAGMENTATION_SOURCES
    from bot.canary.verdict import GATES as GATES
    from bot.canary.verdict import GOODPUT_SOURCES as GOODPUT_SOURCES
    from bot.canary.verdict import MEASURED as MEASURED
    from bot.canary.verdict import PASSED as PASSED
    from bot.canary.verdict import GateResult as GateResult
    from bot.canary.verdict import Gates as Gates
    from bot.canary.verdict import Judged as Judged
    from bot.canary.verdict import Values as Values
    from bot.canary.verdict import Verdict as Verdict
    from bot.canary.verdict import gates_from as gates_from
    from bot.canary.verdict import how_sure as how_sure
    from bot.canary.verdict import judge as judge
    from bot.canary.verdict import judge_values as judge_values
    from bot.canary.verdict import source_note as source_note
    from bot.canary.verdict import values_of as values_of
    from bot.canary.workload import PROMPT_ID_RANGE as PROMPT_ID_RANGE
    from bot.canary.workload import CancelMode as CancelMode
    from bot.canary.workload import Workload as Workload
    from bot.canary.workload import check as check

__all__ = [
    "ALPHA",
    "CanaryReport",
    "CanaryRun",
    "CancelMode",
    "DEFAULT_CONFIDENCE",
    "DEFAULT_LOOKS",
    "DEFAULT_MAX_ERROR_RATE",
    "FRAGMENTATION_SOURCES",
    "GATES",
    "GOODPUT_SOURCES",
    "GateResult",
    "Gates",
    "Guardrail",
    "INTERVAL_S",
    "Judged",
    "LiveVerdict",
    "MEASURED",
    "METRICS_PATHS",
    "MIN_REQUESTS",
    "MIN_WORSE",
    "Outcome",
    "PASSED",
    "PROMPT_ID_RANGE",
    "Progress",
    "RequestRecord",
    "Samples",
    "Spread",
    "StandingGate",
    "Values",
    "Verdict",
    "Workload",
    "analyse",
    "check",
    "default_cap",
    "gates_from",
    "how_sure",
    "judge",
    "judge_values",
    "judged_limits",
    "measure_async",
    "progress_line",
    "source_note",
    "standing",
    "stream_tokens",
    "summary_table",
    "values_of",
    "watch",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
