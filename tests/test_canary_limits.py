"""judged_limits: the one answer to 'which numbers was this change judged by' (run, card,
post-incident record and draft all read it)."""

from __future__ import annotations

from bot.adr.models import AdrGates
from bot.canary.limits import judged_limits


def test_the_limits_the_canary_stored_are_the_ones_shown() -> None:
    gates = AdrGates.model_validate({"max_ttft_p99_ms": 350, "max_tpot_p99_ms": "0.5x before"})
    stored = {"max_ttft_p99_ms": 350.0, "max_tpot_p99_ms": 855.0}
    judged = judged_limits(gates, stored)
    assert judged.resolved and judged.limits() == stored  # '0.5x before' as the number it meant


def test_before_the_canary_ran_only_the_numbers_are_limits() -> None:
    gates = AdrGates.model_validate({"max_ttft_p99_ms": 350, "max_tpot_p99_ms": "0.5x before"})
    assert judged_limits(gates) == AdrGates(max_ttft_p99_ms=350.0)  # the relative one waits
    assert judged_limits(gates, {}).is_empty()  # a stored empty verdict is what was stored
    assert judged_limits(None).is_empty()
