"""Background work with an owner: tasks are kept until done, failures are logged under an id."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from bot.kernel.runtime.ids import new_error_id

log = logging.getLogger("ruleloop.tasks")


class TaskSupervisor:
    """Starts tasks, keeps references so none is garbage-collected mid-flight, drains on stop."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
        """Run ``coro`` in the background."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
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
