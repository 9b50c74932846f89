"""How many examples a fuzz test draws: its fast count in `make test`, or the count `make fuzz`
asks for (``RULELOOP_FUZZ_EXAMPLES``, 10,000 there) when run by hand."""

from __future__ import annotations

import os


def examples(fast: int) -> int:
    """``fast``, unless ``RULELOOP_FUZZ_EXAMPLES`` says how many (a positive integer)."""
    asked = os.environ.get("RULELOOP_FUZZ_EXAMPLES", "").strip()
    if not asked:
        return fast
    if not asked.isdigit() or int(asked) < 1:
        raise ValueError(f"RULELOOP_FUZZ_EXAMPLES={asked!r}: write a positive number of examples")
    return int(asked)
