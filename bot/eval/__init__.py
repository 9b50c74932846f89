"""Graded on incidents it has not seen: a catalogue of induced vLLM incidents, each a real fault
on a real local engine with its ground truth, diagnosed as production diagnoses and graded.

scenario (the scenario file: engine flags, load, fault, truth) · load (closed-loop client
streams sized from what the engine was measured to do) · run (the catalogue on real engines) ·
grades (cause grade, ruled-out precision and recall, abstention, the ADR offered) · table (the
dated table, markdown and JSON, with the machine and engine version).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.eval.grades import Graded as Graded
    from bot.eval.grades import grade as grade
    from bot.eval.run import Ran as Ran
    from bot.eval.run import regrade as regrade
    from bot.eval.run import run_catalogue as run_catalogue
    from bot.eval.scenario import Scenario as Scenario
    from bot.eval.scenario import load_catalogue as load_catalogue
    from bot.eval.scenario import load_scenario as load_scenario
    from bot.eval.table import EvalReport as EvalReport
    from bot.eval.table import markdown as markdown
    from bot.eval.table import report as report

__all__ = [
    "EvalReport",
    "Graded",
    "Ran",
    "Scenario",
    "grade",
    "load_catalogue",
    "load_scenario",
    "markdown",
    "regrade",
    "report",
    "run_catalogue",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
