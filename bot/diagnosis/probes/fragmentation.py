"""KV-cache block fragmentation: the share of allocated KV slots that hold no token.

Two views (both reported; docs/canary.md):
- observed: 1 - resident_tokens / (used_blocks * block_size), from the engine's KV usage gauge
  (used_blocks = kv_cache_usage_perc * (num_gpu_blocks - 1): vLLM's pool excludes a null block)
  and the tokens the canary knows are resident at the moment of the scrape;
- internal: the PagedAttention paper's definition over the in-flight sequences' lengths,
  sum(ceil(n/B)*B - n) / sum(ceil(n/B)*B): the waste inside each sequence's last block.

Without the sequences' lengths (a passive observer has only the gauges),
``estimate_fragmentation`` bounds it: each of the n running sequences leaves 0..B-1 slots of its
last block empty, so the share is in [0, n(B-1) / (used_blocks * B)]; the value is the
midpoint, exact in expectation when lengths are uniform modulo B. It assumes no other empty
slots (no blocks reserved ahead for speculative tokens, no sequence mid-prefill with blocks
allocated beyond what it computed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from bot.kernel.numbers import Estimate


def internal_fragmentation(lengths: Iterable[int], block_size: int) -> float | None:
    """Unused share of the blocks that sequences of these lengths occupy; None if none."""
    if block_size < 1:
        raise ValueError(f"block size must be at least 1, got {block_size}")
    allocated = used = 0
    for n in lengths:
        if n <= 0:
            continue
        slots = math.ceil(n / block_size) * block_size
        allocated += slots
        used += n
    return None if allocated == 0 else (allocated - used) / allocated


def used_blocks(kv_usage: float, num_gpu_blocks: int) -> int:
    """Blocks in use, from vLLM's usage gauge.

    vLLM keeps one null block out of the pool and reports used / (num_gpu_blocks - 1).
    """
    return round(kv_usage * (num_gpu_blocks - 1))


def observed_fragmentation(
    *, resident_tokens: int, kv_usage: float, num_gpu_blocks: int, block_size: int
) -> float | None:
    """1 - resident / allocated slots; None when nothing is allocated, and None (unknown) when
    more tokens are said to be resident than the allocated slots hold: the token count and the
    scrape disagree (taken at different moments), and no share can be read from them."""
    allocated = used_blocks(kv_usage, num_gpu_blocks) * block_size
    if allocated <= 0 or resident_tokens <= 0 or resident_tokens > allocated:
        return None
    return 1.0 - resident_tokens / allocated


ESTIMATE_ASSUMPTION = (
    "each running sequence leaves 0..B-1 slots of its last block empty (uniform modulo B: "
    "midpoint); no other empty slots"
)


def estimate_fragmentation(*, running: int, blocks: int, block_size: int) -> Estimate | None:
    """Fragmentation from the gauges alone: ``running`` sequences in ``blocks`` used blocks.

    None when it cannot be said: nothing allocated, no sequence running, or more sequences
    than blocks (each holds at least one: the gauges were read at different moments).
    """
    if block_size < 1:
        raise ValueError(f"block size must be at least 1, got {block_size}")
    if running <= 0 or blocks <= 0 or running > blocks:
        return None
    high = running * (block_size - 1) / (blocks * block_size)
    return Estimate(value=high / 2, low=0.0, high=high, basis=ESTIMATE_ASSUMPTION)


@dataclass(frozen=True)
class FragmentationSample:
    """One in-flight sample: both views at one scrape."""

    at: float
    observed: float | None
    internal: float | None
    resident_tokens: int
    kv_usage: float


def resident_lengths(
    sequences: Iterable[tuple[int, int]], *, shared_prefix: int
) -> tuple[list[int], int]:
    """Per-sequence KV lengths and the total resident tokens, counting a shared prefix once.

    ``sequences`` are (prompt_tokens, generated_tokens) of requests whose prefill is done.
    With prefix caching the shared prefix's full blocks are one physical copy, so the total
    counts it once; the per-sequence lengths (internal view) still include it.
    """
    lengths = [prompt + generated for prompt, generated in sequences]
    total = sum(lengths)
    if shared_prefix > 0 and len(lengths) > 1:
        total -= shared_prefix * (len(lengths) - 1)
    return lengths, total
