"""`ruleloop eval`: incidents induced on real local engines, diagnosed as production does, graded.

scenario.py    one incident as a file: engine flags, load, fault, fleet, gateway, fix, truth
load.py        closed-loop client streams, sized from what the engine was measured to do
fleet.py       what stands in front: nginx over a fleet, the real gateway, a delay
run.py         the catalogue on real engines: induce, diagnose, grade; re-judge with a runbook
fix.py         a fix tried behind its ADR's gates beside the incident's load
grades.py      the grades: cause, ruled out, cannot tell, the ADR offered, the fix's gate
table.py       the dated table, markdown and JSON, with the machine and the engine version
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
