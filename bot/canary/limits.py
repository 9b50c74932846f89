"""The limits a change's gates were judged by, as numbers (one answer for every reader).

A change's canary resolves its ADR's gates once ('0.5x before' as 855 ms) and the remediation
keeps those numbers (``result["gates"]``). The run, the card, the post-incident record and its
draft all read them through ``judged_limits``, so they cannot show different gates for one change.
"""

from __future__ import annotations

from collections.abc import Mapping

from bot.adr import AdrGates


def judged_limits(gates: AdrGates | None, stored: Mapping[str, float] | None = None) -> AdrGates:
    """The limits as numbers (resolved gates): those the canary stored once it ran; before
    that, the gates that are numbers already (a relative gate has none until its before-run or
    normal is measured)."""
    if stored is not None:
        return AdrGates.of_numbers(stored)
    if gates is None:
        return AdrGates()
    return AdrGates.of_numbers(gates.limits())
