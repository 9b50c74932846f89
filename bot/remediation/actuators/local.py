"""The local actuator: restarts a `ruleloop engine` process with the merged flags.

The engine is found by the port of the target's vllm_url. Its flags are read back from the
running process's own command line (/proc/<pid>/cmdline), not from what we asked for, so a
restart that silently dropped a flag would show.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

from bot.config import LocalActuatorSpec
from bot.engine.process import EngineInfo, EngineManager
from bot.errors import EngineError
from bot.remediation.actuators.base import ActuatorError, Deployed
from bot.remediation.argv import FlagValues, read_flags, with_flags


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

    def __init__(
        self, spec: LocalActuatorSpec, *, vllm_url: str, manager: EngineManager | None = None
    ) -> None:
        parts = urlsplit(vllm_url)
        if parts.hostname is None or parts.port is None:
            raise ActuatorError(f"the local actuator needs a port in vllm_url ({vllm_url})")
        self._spec = spec
        self._host, self._port = parts.hostname, parts.port
        self._manager = manager or EngineManager(state_dir=spec.state_dir)

    async def current(self) -> Deployed:
        """The running engine's flags, read from its process."""
        info = await asyncio.to_thread(self._manager.find, self._port)
        if info is None:
            raise ActuatorError(
                f"no local engine runs on port {self._port}; start it with "
                f"`ruleloop engine up --port {self._port}`"
            )
        return self._deployed(info)

    async def apply(self, flags: FlagValues) -> Deployed:
        """Stop the engine and start it again with ``flags`` merged into its launch flags."""
        before = await self.current()
        launch = with_flags(before.detail["launch_flags"], flags)
        return await self._restart(launch)

    async def promote(self, flags: FlagValues) -> Deployed:
        """One engine: nothing beyond the canary stage."""
        return await self.current()

    async def rollback(self, before: Deployed) -> Deployed:
        """Start the engine again with exactly the launch flags ``before`` recorded."""
        restored = await self._restart(list(before.detail["launch_flags"]))
        if restored.flags != before.flags:
            raise ActuatorError(
                f"after the rollback the engine runs with {restored.flags}, "
                f"not the recorded {before.flags}"
            )
        return restored

    async def _restart(self, launch_flags: list[str]) -> Deployed:
        def restart() -> EngineInfo:
            self._manager.stop(self._port)
            return self._manager.start(
                port=self._port,
                host=self._host,
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
            detail={"launch_flags": list(info.flags), "pid": info.pid, "port": info.port},
        )
