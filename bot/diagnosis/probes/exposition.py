"""A parsed Prometheus exposition: samples by name, with helpers that sum across label sets.

Parsing is prometheus_client's; this module only indexes the samples so that probes can ask
"the value of counter X, summed over all engines" or "the buckets of histogram Y".
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from bot.kernel import ProbeError

Labels = Mapping[str, str]


@dataclass(frozen=True)
class Exposition:
    """All samples of one scrape, indexed by sample name, stamped with the scrape time."""

    at: float
    samples: Mapping[str, list[tuple[Labels, float]]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, *, at: float, only: Collection[str] | None = None) -> Exposition:
        """Parse exposition text; raise ProbeError if it is not the Prometheus text format.

        With ``only``, lines of other metrics are dropped before parsing: a vLLM page is ~700
        lines, and a sampler that needs three gauges should not pay for all of them.
        """
        if only is not None:
            text = select_metrics(text, only)
        index: dict[str, list[tuple[Labels, float]]] = defaultdict(list)
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    index[sample.name].append((dict(sample.labels), float(sample.value)))
        except (ValueError, TypeError, IndexError) as exc:
            raise ProbeError(f"not a Prometheus exposition ({exc})") from exc
        return cls(at=at, samples=dict(index))

    def has(self, name: str) -> bool:
        """Whether any sample of this name was exposed."""
        return name in self.samples

    def first_present(self, names: Iterable[str]) -> str | None:
        """The first of ``names`` (current name first, then older ones) this page exposes."""
        return next((n for n in names if n in self.samples), None)

    def total(self, name: str, *, where: Labels | None = None) -> float | None:
        """Sum of the samples named ``name`` whose labels include ``where``; None if absent."""
        rows = self.samples.get(name)
        if rows is None:
            return None
        picked = [v for labels, v in rows if _matches(labels, where)]
        return math.fsum(picked) if picked else 0.0

    def labels_of(self, name: str) -> list[Labels]:
        """Label sets of the samples named ``name`` (for info metrics like cache_config_info)."""
        return [labels for labels, _ in self.samples.get(name, [])]

    def buckets(self, histogram: str, *, where: Labels | None = None) -> dict[float, float]:
        """Cumulative bucket counts of ``histogram`` by upper bound, summed over the label sets
        that include ``where`` (all of them without it)."""
        out: dict[float, float] = defaultdict(float)
        for labels, value in self.samples.get(f"{histogram}_bucket", []):
            if _matches(labels, where):
                out[float(labels["le"])] += value
        return dict(sorted(out.items()))


_SUFFIXES = ("", "_total", "_created", "_bucket", "_sum", "_count", "_info")


def select_metrics(text: str, names: Collection[str]) -> str:
    """The lines of ``text`` that belong to the metric families ``names`` (comments included)."""
    wanted = {name + suffix for name in names for suffix in _SUFFIXES}
    for name in names:  # counters are often listed by their sample name, x_total
        wanted.add(name.removesuffix("_total"))
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            name = parts[2] if len(parts) > 2 else ""
        else:
            cut = len(line)
            for sep in ("{", " "):
                pos = line.find(sep)
                if 0 <= pos < cut:
                    cut = pos
            name = line[:cut]
        if name in wanted:
            kept.append(line)
    return "\n".join(kept) + "\n"


def _matches(labels: Labels, where: Labels | None) -> bool:
    return not where or all(labels.get(k) == v for k, v in where.items())
