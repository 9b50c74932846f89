"""A canary stage beside the engine: a share of the inference requests goes to a second engine.

With ``ruleloop gateway --canary-upstream URL --canary-weight W``, W of the inference requests
(exactly, spread evenly: every 1/W-th) go to the canary engine and the rest to the engine, the
way a Kubernetes Service spreads requests over a canary Deployment's pods beside the baseline's.
Both serve the same production traffic over the same minutes, so ``bot.canary.live`` can judge
the canary engine against the engine like for like (``/apply-adr``'s live stage on a local
target, ``bot.change.actuators.local``).

Either engine may be down (the canary one exists only while a change is on its canary stage;
the engine restarts when a change is promoted): a request whose upstream refuses the connection
was not sent, so it goes to the other one. Only a refused connection fails over; a request an
engine accepted is that engine's to answer.

  ruleloop_gateway_stage_requests_total{stage}    requests proxied, by the engine that took
      them: engine or canary
  ruleloop_gateway_stage_failovers_total{stage}   requests a refused connection sent from that
      engine to the other one
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter

from bot.gateway.relay import Exchange, Relay, Unreachable

ENGINE, CANARY = "engine", "canary"


@dataclass
class Split:
    """The engine's relay and the canary's, and the canary's share of requests."""

    engine: Relay
    canary: Relay
    weight: float  # 0 < weight < 1
    _owed: float = field(default=0.0, repr=False)

    def order(self) -> tuple[tuple[str, Relay], tuple[str, Relay]]:
        """Who takes the next request, and who takes it if that one refuses the connection:
        the canary every time the owed share reaches a whole request."""
        self._owed += self.weight
        if self._owed >= 1.0:
            self._owed -= 1.0
            return (CANARY, self.canary), (ENGINE, self.engine)
        return (ENGINE, self.engine), (CANARY, self.canary)


class StageCounts:
    """The split's counters, on the gateway's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        served = Counter(
            "ruleloop_gateway_stage_requests",
            "Inference requests proxied, by the engine that took them (engine or canary).",
            ["stage"], registry=registry,
        )  # fmt: skip
        failed = Counter(
            "ruleloop_gateway_stage_failovers",
            "Requests a refused connection sent from this engine to the other one.",
            ["stage"], registry=registry,
        )  # fmt: skip
        self.served = {s: served.labels(s) for s in (ENGINE, CANARY)}
        self.failed = {s: failed.labels(s) for s in (ENGINE, CANARY)}


async def relay_split(
    split: Split, counts: StageCounts, send_to: Callable[[Relay, bool], Awaitable[Exchange]]
) -> Exchange:
    """Proxy one request (``send_to(relay, fail_over)``) through the stage whose turn it is, or
    through the other one when that one refuses the connection."""
    (first, relay), (second, other) = split.order()
    try:
        exchange = await send_to(relay, True)
    except Unreachable:
        counts.failed[first].inc()
        counts.served[second].inc()
        return await send_to(other, False)
    counts.served[first].inc()
    return exchange
