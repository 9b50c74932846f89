"""A target's window over all its replicas: each scraped in the same rounds, merged exactly.

Every round scrapes every replica at once (at most MAX_CONCURRENT_SCRAPES at a time). Each
page is tagged with its replica and the process that answered
(bot/diagnosis/probes/engine_identity.py);
deltas are only taken between pages of one process, then summed
(bot/diagnosis/probes/fleet_merge.py).
A URL that answers from several engines is refused: no number of it is the target's.
A replica that restarted or stopped answering is said in the details, never read as zero work.
A prefill/decode target's two pools are also merged each on its own (``FleetWindow.pools``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from bot.diagnosis.probes.engine_identity import (
    EngineIdentity,
    identity_of,
    processes,
    several_engines_message,
)
from bot.diagnosis.probes.exposition import Exposition
from bot.diagnosis.probes.fleet_merge import Member, merge_rounds
from bot.diagnosis.probes.replicas import POOLS, Pool, Replica
from bot.diagnosis.probes.sampling import SampledWindow
from bot.kernel import ProbeError, RuleloopError
from bot.kernel.runtime.redact import redact

MAX_CONCURRENT_SCRAPES = 8  # a fleet of hundreds is scraped in waves, not all at once
Answer = Exposition | RuleloopError  # a replica's answer to one round


@dataclass(frozen=True)
class ReplicaWindow:
    """One replica over the window: what it answered, from which processes, and its numbers."""

    replica: Replica
    answered: int  # rounds it answered
    rounds: int
    processes: tuple[EngineIdentity | None, ...]  # in the order they answered
    window: SampledWindow | None  # its own pages (None: it never answered)
    error: str | None  # its last failed scrape

    @property
    def notes(self) -> list[str]:
        """What a reader of its numbers must know: a restart, scrapes it did not answer."""
        notes = []
        if len(self.processes) > 1:
            starts = ", then ".join(str(p) for p in self.processes)
            notes.append(
                f"restarted inside the window ({starts}): deltas taken within each process, "
                "the work between its last and the next one's first scrape is not counted"
            )
        if self.answered < self.rounds:
            left = " and is left out of the fleet's numbers" if self.answered < 2 else ""
            notes.append(
                f"answered {self.answered} of {self.rounds} scrapes{left} "
                f"(last failure: {self.error})"
            )
        return notes

    def summary(self) -> dict[str, object]:
        """Its main numbers, JSON-able (None where it gave none)."""
        out: dict[str, object] = {"url": redact(self.replica.url)}
        if self.replica.pod:  # discovered: who to look at (kubectl logs, describe pod)
            out.update(pod=self.replica.pod, node=self.replica.node)
        if self.replica.pool:  # prefill/decode: judged within its pool only
            out["pool"] = self.replica.pool
        window = self.window if self.answered >= 2 else None
        engine = None if window is None else window.engine
        out.update(
            ttft_p99_ms=None if engine is None else engine.ttft_ms.p99,
            tpot_p99_ms=None if window is None else window.tpot_ms.p99,
            itl_p99_ms=None if engine is None else engine.itl_ms.p99,
            queue_time_p99_ms=None if engine is None else engine.queue_time_ms.p99,
            requests_finished=None if engine is None else engine.requests_finished,
            goodput_ratio=None if engine is None else engine.goodput_ratio,
        )
        if self.notes:
            out["note"] = "; ".join(self.notes)
        return out


@dataclass(frozen=True)
class FleetWindow:
    """The merged window of a target's replicas, and each replica's own."""

    window: SampledWindow
    replicas: tuple[ReplicaWindow, ...]
    # prefill/decode disaggregation: each pool's replicas merged on their own (empty otherwise)
    pools: Mapping[Pool, SampledWindow] = field(default_factory=dict)

    def details(self) -> dict[str, object]:
        """Each replica's numbers under ``replicas`` (nothing for one engine with nothing to
        say: its numbers are the target's), and each pool's merged ones under ``pools``."""
        if len(self.replicas) == 1 and not self.replicas[0].notes:
            return {}
        out: dict[str, object] = {
            "replicas": {r.replica.address: r.summary() for r in self.replicas}
        }
        if self.pools:
            out["pools"] = {pool: self._pool_summary(pool) for pool in self.pools}
        return out

    def _pool_summary(self, pool: Pool) -> dict[str, object]:
        """A pool's merged numbers and its replicas, JSON-able."""
        window = self.pools[pool]
        engine = window.engine
        return {
            "replicas": [r.replica.address for r in self.replicas if r.replica.pool == pool],
            "ttft_p99_ms": engine.ttft_ms.p99,
            "tpot_p99_ms": window.tpot_ms.p99,
            "itl_p99_ms": engine.itl_ms.p99,
            "queue_time_p99_ms": engine.queue_time_ms.p99,
            "requests_finished": engine.requests_finished,
        }


async def sample_fleet(
    replicas: Sequence[Replica],
    scrape: Callable[[Replica], Awaitable[Exposition]],
    *,
    seconds: float,
    interval_s: float,
    sleep: Callable[[float], Awaitable[None]],
    clock: Callable[[], float],
) -> FleetWindow:
    """Scrape every replica now, then every ``interval_s`` until ``seconds`` have passed."""
    gate = asyncio.Semaphore(MAX_CONCURRENT_SCRAPES)

    async def one(replica: Replica) -> Answer:
        async with gate:
            try:
                return await scrape(replica)
            except RuleloopError as exc:
                if len(replicas) == 1:
                    raise  # one engine that cannot be read: the window cannot be, as before
                return exc

    rounds: list[list[Answer]] = []
    times: list[float] = []

    async def next_round() -> None:
        answers = list(await asyncio.gather(*(one(r) for r in replicas)))
        pages = [a for a in answers if isinstance(a, Exposition)]
        if not rounds and not pages:
            raise ProbeError("no replica answered: " + "; ".join(str(a) for a in answers))
        rounds.append(answers)
        times.append(max((p.at for p in pages), default=clock()))

    await next_round()
    while times[-1] - times[0] < seconds:
        await sleep(min(interval_s, seconds - (times[-1] - times[0])))
        await next_round()
    return fleet_of(replicas, rounds, times)


def fleet_of(
    replicas: Sequence[Replica], rounds: Sequence[Sequence[Answer]], times: Sequence[float]
) -> FleetWindow:
    """The fleet window from every round's answers (``rounds[k][i]``: replica i in round k)."""
    views = [
        replica_window(replica, [answers[i] for answers in rounds], times)
        for i, replica in enumerate(replicas)
    ]
    _refuse_shared(views)
    members = [m for v in views for m in v[1]]
    window = SampledWindow(pages=tuple(merge_rounds(members, times)))
    return FleetWindow(
        window=window, replicas=tuple(v[0] for v in views), pools=_pools(views, times)
    )


def _pools(
    views: Sequence[tuple[ReplicaWindow, list[Member]]], times: Sequence[float]
) -> dict[Pool, SampledWindow]:
    """Each pool's replicas merged on their own (none for a fleet of like engines); a pool none
    of whose replicas answered reads as nothing, never as the other pool."""
    pools: dict[Pool, SampledWindow] = {}
    for pool in POOLS:
        if any(view.replica.pool == pool for view, _ in views):
            own = [m for view, members in views if view.replica.pool == pool for m in members]
            pools[pool] = SampledWindow(pages=tuple(merge_rounds(own, times)))
    return pools


def replica_window(
    replica: Replica, answers: Sequence[Answer], times: Sequence[float]
) -> tuple[ReplicaWindow, list[Member]]:
    """One replica's window and its members (one per process); ProbeError when its URL
    answered from more than one engine."""
    pages = {k: a for k, a in enumerate(answers) if isinstance(a, Exposition)}
    errors = [a for a in answers if not isinstance(a, Exposition)]
    identities = {k: identity_of(page) for k, page in pages.items()}
    seen = processes([identities[k] for k in sorted(pages)])
    if seen.several_engines:
        raise ProbeError(several_engines_message(redact(replica.url), len(seen.order)))
    members = []
    for n, identity in enumerate(seen.order):
        labels = {"replica": replica.address}
        if len(seen.order) > 1:
            labels["process"] = str(n)
        own = {k: page for k, page in pages.items() if identities[k] == identity}
        members.append(Member(labels=labels, pages=own))
    window = SampledWindow(pages=tuple(merge_rounds(members, times))) if members else None
    view = ReplicaWindow(
        replica=replica,
        answered=len(pages),
        rounds=len(answers),
        processes=seen.order,
        window=window,
        error=str(errors[-1]) if errors else None,
    )
    return view, members


def _refuse_shared(views: Sequence[tuple[ReplicaWindow, list[Member]]]) -> None:
    """Two listed URLs that answer from one engine would count its work twice."""
    owner: dict[EngineIdentity, Replica] = {}
    for view, _ in views:
        for identity in view.processes:
            if identity is None:
                continue
            other = owner.setdefault(identity, view.replica)
            if other != view.replica:
                raise ProbeError(
                    redact(
                        f"{other.url} and {view.replica.url} answer from the same engine "
                        f"({identity}): list each engine once in replicas"
                    )
                )
