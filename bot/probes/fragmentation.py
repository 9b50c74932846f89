"""KV-cache block fragmentation: the share of allocated KV slots that hold no token.

Two views (both reported; docs/canary.md):
- observed: 1 - resident_tokens / (used_blocks * block_size), from the engine's KV usage gauge
  (used_blocks = kv_cache_usage_perc * (num_gpu_blocks - 1): vLLM's pool excludes a null block)
  and the tokens the canary knows are resident at the moment of the scrape;
- internal: the PagedAttention paper's definition over the in-flight sequences' lengths,
  sum(ceil(n/B)*B - n) / sum(ceil(n/B)*B): the waste inside each sequence's last block.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


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
    """1 - resident / allocated slots, clamped to [0, 1]; None when nothing is allocated."""
    allocated = used_blocks(kv_usage, num_gpu_blocks) * block_size
    if allocated <= 0 or resident_tokens <= 0:
        return None
    return min(max(1.0 - resident_tokens / allocated, 0.0), 1.0)


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
