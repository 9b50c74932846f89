"""The diagnosis: run an incident's runbook, set the four numbers against the ADR baseline."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.diagnosis.causes import CauseVerdict as CauseVerdict
    from bot.diagnosis.causes import DriftCheck as DriftCheck
    from bot.diagnosis.causes import RulesInForce as RulesInForce
    from bot.diagnosis.causes import from_summary as from_summary
    from bot.diagnosis.causes import judge as judge_causes
    from bot.diagnosis.chart import render_chart as render_chart
    from bot.diagnosis.chart_data import ChartData as ChartData
    from bot.diagnosis.models import GATE_OF as GATE_OF
    from bot.diagnosis.models import Baseline as Baseline
    from bot.diagnosis.models import Diagnosis as Diagnosis
    from bot.diagnosis.models import summary_numbers as summary_numbers
    from bot.diagnosis.normal import KEYS as KEYS
    from bot.diagnosis.normal import NormalReader as NormalReader
    from bot.diagnosis.service import Diagnoser as Diagnoser
    from bot.diagnosis.service import match_readings as match_readings

__all__ = [
    "Baseline",
    "CauseVerdict",
    "ChartData",
    "Diagnoser",
    "Diagnosis",
    "DriftCheck",
    "GATE_OF",
    "KEYS",
    "NormalReader",
    "RulesInForce",
    "cause_text",
    "from_summary",
    "judge_causes",
    "match_readings",
    "render_chart",
    "replica_text",
    "summary_numbers",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
