"""The memory a step costs, as tracemalloc sees it (every thread's Python allocations)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def peak_of(step: Awaitable[T]) -> tuple[T, int]:
    """``step``'s result and the peak bytes allocated while it ran."""
    tracemalloc.start()
    try:
        result = await step
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak
