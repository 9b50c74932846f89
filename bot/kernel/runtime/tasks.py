"""Background work with an owner: tasks are kept until done, failures are logged under an id.

Work that a flood could multiply (a diagnosis per new incident, a delivery per notification)
is started in a bounded group (``try_spawn``): past the group's limit the coroutine is not run
and the caller leaves the work owed in the store, where a scheduled job picks it up at its own
pace; each one shed is counted (``ruleloop_background_shed_total``, a self-alert).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

from bot.kernel.runtime.ids import new_error_id

log = logging.getLogger("ruleloop.tasks")


class TaskSupervisor:
    """Starts tasks, keeps references so none is garbage-collected mid-flight, drains on stop."""

    def __init__(self, *, on_shed: Callable[[str], None] | None = None) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._groups: dict[asyncio.Task[Any], str] = {}
        self._running: Counter[str] = Counter()
        self._on_shed = on_shed  # told the group of each coroutine shed
        self.shed: Counter[str] = Counter()  # coroutines not run, by group

    def spawn(self, coro: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
        """Run ``coro`` in the background."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def try_spawn(
        self,
        coro: Coroutine[Any, Any, Any],
        *,
        name: str,
        group: str,
        limit: int,
        claimed: bool = False,
    ) -> bool:
        """Run ``coro`` unless ``limit`` tasks of ``group`` run already; then close it unrun,
        count it shed and return False (the caller's work stays owed). ``claimed``: the caller
        already holds the work (a claim in the store that would outlive a shed), so it runs
        whatever the count, and counts in the group."""
        if not claimed and not self.has_room(group, limit):
            coro.close()
            self.shed[group] += 1
            if self._on_shed is not None:
                self._on_shed(group)
            return False
        task = self.spawn(coro, name=name)
        self._groups[task] = group
        self._running[group] += 1
        return True

    def has_room(self, group: str, limit: int) -> bool:
        """Whether a task of ``group`` may start now."""
        return self._running[group] < limit

    async def room(self, group: str, limit: int, *, timeout_s: float) -> bool:
        """Wait until a task of ``group`` may start, at most ``timeout_s``; whether it may."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.has_room(group, limit):
            running = {t for t, g in self._groups.items() if g == group}
            left = deadline - loop.time()
            if left <= 0 or not running:
                return self.has_room(group, limit)
            await asyncio.wait(running, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        return True

    def running(self, group: str) -> int:
        """Tasks of ``group`` not finished yet."""
        return self._running[group]

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        group = self._groups.pop(task, None)
        if group is not None:
            self._running[group] -= 1
        if not task.cancelled() and task.exception() is not None:
            error_id = new_error_id()
            log.error(
                "background task %s failed (id %s)",
                task.get_name(),
                error_id,
                exc_info=task.exception(),
            )

    @property
    def pending(self) -> int:
        """Tasks not finished yet."""
        return len(self._tasks)

    async def drain(self, *, timeout_s: float = 30.0) -> None:
        """Wait for running tasks, and for the tasks they start (work deferred past a Slack
        ack starts its own); cancel what is still running after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._tasks:
            left = deadline - loop.time()
            _, pending = await asyncio.wait(set(self._tasks), timeout=max(left, 0))
            if pending and loop.time() >= deadline:
                for task in pending:
                    task.cancel()
                await asyncio.wait(pending)
                return
