"""The local actuator: restarts a `ruleloop engine` process with the merged flags.

With a ``canary_url`` the change has a canary stage: ``apply`` starts a second engine on that
port with the change (the target's engine keeps serving as it was; the project's gateway sends
the canary engine its share of the traffic, ``ruleloop gateway --canary-upstream``), ``promote``
restarts the target's engine with the change and then stops the canary one (the gateway sends
each engine's requests to the other while it restarts), and ``rollback`` stops the canary
engine (and restores the target's engine if a promotion had reached it). ``stage`` starts the
canary engine (the target's without a canary stage) with launch flags a record kept, restored
as ``rollback`` restores them.

The engine is found by the port of the target's vllm_url. Its flags are read back from the
running process's own command line (/proc/<pid>/cmdline), not from what we asked for, so a
restart that silently dropped a flag would show.

What it reports for the record keeps the launch flags as ``argv.record`` does (tunable flags and
a fingerprint; other values may be secrets). Before a restart the full launch flags are kept on
this machine only, beside the engine's own state file, so a rollback after an engine that did
not come back can still start it as it was.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bot.change.actuators.base import ActuatorError, Deployed
from bot.change.argv import FlagValues, fingerprint, read_flags, record, restore, with_flags
from bot.engine import EngineInfo, EngineManager
from bot.kernel import EngineError, LocalActuatorSpec


def process_argv(pid: int) -> list[str] | None:
    """The command line of a running process, or None when it cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


class LocalActuator:
    """Restart the engine on ``vllm_url``'s port with new flags; keep the old ones to go back."""

    kind = "local"
    changes_flags = True

    def __init__(
        self, spec: LocalActuatorSpec, *, vllm_url: str, manager: EngineManager | None = None
    ) -> None:
        parts = urlsplit(vllm_url)
        if parts.hostname is None or parts.port is None:
            raise ActuatorError(f"the local actuator needs a port in vllm_url ({vllm_url})")
        self._spec = spec
        self._host, self._port = parts.hostname, parts.port
        self._canary: tuple[str, int] | None = None
        if spec.canary_url is not None:
            canary = urlsplit(spec.canary_url)
            assert canary.hostname is not None and canary.port is not None  # the spec's pattern
            self._canary = (canary.hostname, canary.port)
        self._manager = manager or EngineManager(state_dir=spec.state_dir, cpu_limit=spec.cpu_limit)

    async def aclose(self) -> None:
        """Nothing to close: the engine is a process, reached per call."""

    async def current(self) -> Deployed:
        """The running engine's flags, read from its process."""
        return self._deployed(await self._running())

    async def apply(self, flags: FlagValues) -> Deployed:
        """Stop the engine and start it again with ``flags`` merged into its launch flags; with
        a canary stage, start the canary engine so instead (the engine serves on as it was)."""
        info = await self._running()
        await asyncio.to_thread(self._keep, info.flags)
        if self._canary is None:
            return await self._restart(with_flags(info.flags, flags))
        host, port = self._canary
        return await self._restart(with_flags(info.flags, flags), host=host, port=port)

    async def promote(self, flags: FlagValues) -> Deployed:
        """With a canary stage: the engine restarted with the change, then the canary engine
        stopped. One engine: nothing beyond the canary stage."""
        if self._canary is None:
            return await self.current()
        info = await self._running()
        promoted = await self._restart(with_flags(info.flags, flags))
        await asyncio.to_thread(self._manager.stop, self._canary[1])
        return promoted

    async def rollback(self, before: Deployed) -> Deployed:
        """Start the engine again with exactly the launch flags ``before`` recorded; with a
        canary stage, stop the canary engine, and leave the engine be if it still runs them."""
        if self._canary is not None:
            await asyncio.to_thread(self._manager.stop, self._canary[1])
            serving = await asyncio.to_thread(self._manager.find, self._port)
            if serving is not None and self._deployed(serving).flags == before.flags:
                return self._deployed(serving)
        launch, exact = await self._recorded(before)
        restored = await self._restart(launch)
        if restored.flags != before.flags:
            raise ActuatorError(
                f"after the rollback the engine runs with {restored.flags}, "
                f"not the recorded {before.flags}"
            )
        if not exact:
            kept = before.detail.get("argv") or {}
            raise ActuatorError(
                f"the engine on port {self._port} runs the recorded tunable flags again, but its "
                "other launch arguments are not the ones recorded before the change (argv "
                f"{fingerprint(launch)[:19]}, recorded {kept['sha256'][:19]}); "
                "check them by hand"
            )
        return restored

    async def stage(self, recorded: Deployed) -> Deployed:
        """Start the canary engine (the engine itself without a canary stage) with the launch
        flags ``recorded`` kept, restored as a rollback restores them (tunable flags not
        recorded are removed); the engine serves on as it was when there is a canary stage."""
        info = await self._running()
        await asyncio.to_thread(self._keep, info.flags)
        launch, _ = await self._recorded(recorded)
        host, port = self._canary if self._canary is not None else (None, None)
        staged = await self._restart(launch, host=host, port=port)
        if staged.flags != recorded.flags:
            raise ActuatorError(
                f"the engine started with {staged.flags}, not the recorded {recorded.flags}"
            )
        return staged

    async def _recorded(self, before: Deployed) -> tuple[list[str], bool]:
        """The launch flags ``before`` recorded, the blanks filled from those now, and whether
        they are exactly the recorded ones (``argv.restore``)."""
        kept: dict[str, Any] = before.detail.get("argv") or {}
        if not kept:  # a record written before argv records: the launch flags themselves
            return list(before.detail["launch_flags"]), True
        return restore(kept, await asyncio.to_thread(self._launch_flags))

    async def _running(self) -> EngineInfo:
        info = await asyncio.to_thread(self._manager.find, self._port)
        if info is None:
            raise ActuatorError(
                f"no local engine runs on port {self._port}; start it with "
                f"`ruleloop engine up --port {self._port}`"
            )
        return info

    def _kept_path(self) -> Path:
        return self._manager.state_dir / f"rollback-{self._port}.json"

    def _keep(self, launch_flags: list[str]) -> None:
        """The launch flags before a change, on this machine only (owner-readable)."""
        path = self._kept_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(list(launch_flags), fh)

    def _launch_flags(self) -> list[str]:
        """The launch flags now: the running engine's, else those kept before the change."""
        info = self._manager.find(self._port)
        if info is not None:
            return list(info.flags)
        try:
            return [str(a) for a in json.loads(self._kept_path().read_text())]
        except (OSError, ValueError) as exc:
            raise ActuatorError(
                f"cannot roll back: no engine runs on port {self._port} and its launch flags "
                f"from before the change are not in {self._kept_path()}"
            ) from exc

    async def _restart(
        self, launch_flags: list[str], *, host: str | None = None, port: int | None = None
    ) -> Deployed:
        """The engine on ``port`` (the target's unless given) stopped and started again."""

        def restart() -> EngineInfo:
            self._manager.stop(port or self._port)
            return self._manager.start(
                port=port or self._port,
                host=host or self._host,
                flags=launch_flags,
                timeout_s=self._spec.start_timeout_s,
            )

        try:
            info = await asyncio.to_thread(restart)
        except EngineError as exc:
            raise ActuatorError(
                f"the engine did not come back with the new flags: {exc.reason or exc}"
            ) from exc
        return self._deployed(info)

    def _deployed(self, info: EngineInfo) -> Deployed:
        argv = process_argv(info.pid)
        running = argv if argv is not None else info.flags
        return Deployed(
            flags=read_flags(running),
            base_url=info.base_url,
            detail={"argv": record(info.flags), "pid": info.pid, "port": info.port},
        )
