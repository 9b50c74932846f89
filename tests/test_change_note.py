"""What a reviewing actuator (git) is told about a change writes its numbers as every other
surface does: the catalogue's labels and numbers/text's form ('1,710 ms', not '1,710.0 ms')."""

from __future__ import annotations

from bot.change.actuators.base import ChangeContext, Deployed
from bot.kernel.store.models import Remediation
from bot.remediation.change_note import give_context


class Recording:
    """An actuator that only keeps the context it is given (what the git actuator records)."""

    kind = "recording"

    def __init__(self) -> None:
        self.context: ChangeContext | None = None

    def prepare(self, context: ChangeContext) -> None:
        self.context = context


def test_the_before_run_reads_as_on_every_other_surface() -> None:
    actuator = Recording()
    rem = Remediation(id=7, adr_id="ADR-20260831-01", target="prod-a", requested_by="ana",
                      approved_by=["bo"], incident_id=3)  # fmt: skip
    numbers = {"ttft_p99_ms": 1710.0, "tpot_p99_ms": 41.25, "goodput_ratio": 0.93,
               "kv_fragmentation": None, "queue_depth": 4.0}  # fmt: skip
    give_context(actuator, rem, before=Deployed(flags={}, base_url="http://x"), numbers=numbers)  # type: ignore[arg-type]
    assert actuator.context is not None
    measured = actuator.context.description.split("the canary measured:\n")[1]
    assert measured.splitlines() == [
        "- TTFT p99: 1,710 ms",
        "- TPOT p99: 41.2 ms",
        "- Goodput: 93.0 %",
        "- queue_depth: 4",
    ]
