"""Merge the pages of several engine processes into one page per sampling round.

Each member is one process of one replica, with the pages it answered by round. The merged
page of a round holds every member's samples with its ``replica`` (and, for a replica that
restarted, ``process``) label, so the single-engine readers (``read_window``,
``Quantiles.from_histogram``, ``gauge``), which sum over label sets, read the fleet: counters
and histogram buckets summed, each member's delta taken between its own first and last page
(never across two processes). A round a member did not answer carries its nearest page's
counters and no gauges: its work is counted once, its queue is not guessed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bot.diagnosis.probes.exposition import Exposition, Labels

# Samples that only grow inside one process (or describe it): kept on a carried-over page.
MONOTONIC_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created", "_info")


@dataclass(frozen=True)
class Member:
    """One engine process of one replica and the pages it answered, by round."""

    labels: Labels  # e.g. {"replica": "10.0.0.5:8000"}, plus "process" after a restart
    pages: Mapping[int, Exposition]

    def page_at(self, round_: int) -> Exposition:
        """Its page of a round, or the nearest one's counters when it did not answer then."""
        if round_ in self.pages:
            return self.pages[round_]
        earlier = [k for k in self.pages if k < round_]
        nearest = max(earlier) if earlier else min(self.pages)
        return counters_only(self.pages[nearest])


def counters_only(page: Exposition) -> Exposition:
    """The page without its gauges (running, waiting, KV usage say nothing of another round)."""
    return Exposition(
        at=page.at,
        samples={n: rows for n, rows in page.samples.items() if n.endswith(MONOTONIC_SUFFIXES)},
    )


def labelled(page: Exposition, labels: Labels) -> Exposition:
    """The page with ``labels`` added to every sample."""
    return Exposition(
        at=page.at,
        samples={
            name: [({**own, **labels}, value) for own, value in rows]
            for name, rows in page.samples.items()
        },
    )


def merge_rounds(members: Sequence[Member], times: Sequence[float]) -> list[Exposition]:
    """One merged page per round (stamped with ``times``); a lone member that answered every
    round is returned as it was scraped."""
    if len(members) == 1 and len(members[0].pages) == len(times):
        return [members[0].pages[k] for k in range(len(times))]
    merged = []
    for k, at in enumerate(times):
        samples: dict[str, list[tuple[Labels, float]]] = defaultdict(list)
        for member in members:
            for name, rows in labelled(member.page_at(k), member.labels).samples.items():
                samples[name].extend(rows)
        merged.append(Exposition(at=at, samples=dict(samples)))
    return merged
