"""Which run owns a change (a remediation, a tuning session, a drift before-run), and how it
shows it is alive.

A run (the approving replica's, or the one a resume starts) is a ``runner`` id written on the
remediation when it takes it; every step it writes is conditional on still being that runner
(and on the state it expects), so of two runs that both believe they own a change, the one that
lost it stops at its next step (``LostRun``) without touching the target again. While it works,
the run's heartbeat stamps the remediation on the database's clock; a write the store refuses
is retried with backoff and never ends the heartbeat, so a blip in the store does not make a
live run look dead to the other replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger("ruleloop.remediation")
Beat = Callable[[], Awaitable[bool]]  # one heartbeat write: False when the run is not ours
Sleep = Callable[[float], Awaitable[None]]  # the wait between heartbeats (a seam for tests)


class LostRun(Exception):
    """Another replica took this remediation over (or it moved on): this run must stop."""


def retry_delay(every_s: float, failures: int) -> float:
    """How long until the next heartbeat: ``every_s``, or sooner after failed writes (a
    twentieth of it, doubling with each failure, never more than ``every_s``)."""
    if failures == 0:
        return every_s
    return min(every_s, every_s / 20 * 2.0 ** (failures - 1))


async def heartbeat(
    beat: Beat,
    *,
    every_s: float,
    name: str,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Beat every ``every_s`` until cancelled, or until a beat says the run is not ours."""
    failures = 0
    while True:
        await sleep(retry_delay(every_s, failures))
        try:
            alive = await beat()
        except Exception as exc:  # the store refused: keep trying, the run is alive
            failures += 1
            log.warning("heartbeat of %s failed (%d in a row), retrying: %s", name, failures, exc)
            continue
        if failures:
            log.info("heartbeat of %s written again after %d failures", name, failures)
        failures = 0
        if not alive:
            log.info("%s is no longer this run's (taken over, or ended): heartbeat stops", name)
            return


@contextlib.asynccontextmanager
async def beating(
    beat: Beat, *, every_s: float, name: str, sleep: Sleep = asyncio.sleep
) -> AsyncIterator[None]:
    """Heartbeats while the block runs (every kind of change: a remediation's run, a tuning
    session, a drift before-run), stopped when it ends however it ends."""
    heart = asyncio.create_task(heartbeat(beat, every_s=every_s, name=name, sleep=sleep))
    try:
        yield
    finally:
        heart.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await heart


async def owned(
    work: Coroutine[Any, Any, None],
    beat: Beat,
    *,
    every_s: float,
    name: str,
    sleep: Sleep = asyncio.sleep,
) -> bool:
    """Run ``work`` with heartbeats (waiting between them with ``sleep``); False when it
    stopped because the run was lost."""
    try:
        async with beating(beat, every_s=every_s, name=name, sleep=sleep):
            await work
    except LostRun:
        log.warning(
            "%s was taken over by another replica: this run stops without touching the target",
            name,
        )
        return False
    return True
