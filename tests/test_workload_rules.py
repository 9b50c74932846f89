"""Rules that know the workload they were proven on (issue 42): an ADR that records its
``workload:`` is offered at an incident only when production's workload, read in the diagnosis
window, is alike in what the requests are (lengths, prefix-cache hits), and the thread says why
the other rule was not. Two rules for two workloads coexist; neither is offered for a third.
Shapes here are built from known request lengths as vLLM's histograms count them."""

from __future__ import annotations

import random
from pathlib import Path

from bot.adr import MatchResult, by_workload
from bot.adr.models import Adr
from bot.adr.parse import parse
from bot.adr.workload import WorkloadShape
from tests.workload_pages import chat, long_system_prompt, shape

SEED = Path(__file__).parent.parent / "adr" / "ADR-20260831-01-kv-cache-paging-throughput.md"


def rule(adr_id: str, workload: WorkloadShape | None) -> MatchResult:
    seed = parse(SEED.read_text(encoding="utf-8"))
    adr: Adr = seed.model_copy(update={"id": adr_id, "workload": workload})
    return MatchResult(adr=adr, conditions=())


def with_hits(base: WorkloadShape, hit_rate: float, rate: float = 4.0) -> WorkloadShape:
    prefix = base.prefix.model_copy(update={"hit_rate": hit_rate})
    arrivals = base.arrivals.model_copy(update={"request_rate": rate})
    return base.model_copy(update={"prefix": prefix, "arrivals": arrivals})


def agents(rate: float = 4.0) -> WorkloadShape:
    """Agents behind one long system prompt, most of it served from the prefix cache."""
    return with_hits(long_system_prompt(), 0.85, rate)


def chats() -> WorkloadShape:
    return with_hits(chat(), 0.02)


CHAT_RULE, AGENT_RULE, ANY_RULE = "ADR-20261201-01", "ADR-20261205-02", "ADR-20260831-01"


def offered(live: WorkloadShape | None) -> tuple[list[str], list[str]]:
    results = [rule(CHAT_RULE, chats()), rule(AGENT_RULE, agents()), rule(ANY_RULE, None)]
    kept, lines = by_workload(results, live, "no request finished in the window")
    return [r.adr.id for r in kept], lines


def test_each_workload_is_answered_by_the_rule_proven_on_it_and_says_why_not_the_other() -> None:
    ids, lines = offered(chats())
    assert ids == [CHAT_RULE, ANY_RULE]  # a rule without a workload answers any
    (line,) = lines
    assert line.startswith(f"{AGENT_RULE} not offered: proven on another workload (")
    assert "prompt tokens" in line and "DRIFTED" in line and "prefix-cache hit rate" in line
    ids, lines = offered(agents())
    assert ids == [AGENT_RULE, ANY_RULE]
    assert lines[0].startswith(f"{CHAT_RULE} not offered: proven on another workload")


def test_a_third_workload_is_answered_by_neither_rule() -> None:
    rng = random.Random(5)  # long prompts of their own, no prefix shared: neither chats nor agents
    third = shape([rng.randint(600, 900) for _ in range(200)], [rng.randint(4, 12) for _ in range(200)],
                  hit_rate=0.0)  # fmt: skip
    ids, lines = offered(third)
    assert ids == [ANY_RULE]
    assert [line.split(" ")[0] for line in lines] == [CHAT_RULE, AGENT_RULE]
    assert all("not offered: proven on another workload" in line for line in lines)


def test_a_surge_of_the_same_traffic_still_matches() -> None:
    """An incident is often more of the very traffic a rule was proven on: the rate is not
    compared (the drift job compares it; a rule's match does not)."""
    ids, lines = offered(agents(rate=40.0))
    assert ids == [AGENT_RULE, ANY_RULE] and len(lines) == 1


def test_no_workload_read_offers_both_on_their_numbers_and_says_so() -> None:
    ids, lines = offered(None)
    assert ids == [CHAT_RULE, AGENT_RULE, ANY_RULE]
    assert lines == [
        f"{adr}: production's workload not compared with the one it was proven on: no request "
        "finished in the window; offered on its numbers alone"
        for adr in (CHAT_RULE, AGENT_RULE)
    ]
