"""The local actuator's stage (a drift before-run's flags) and rollback, on engines held in
memory: which engine is started with which launch flags (no process runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.change.actuators.local import LocalActuator
from bot.change.argv import FlagValues, read_flags
from bot.engine import EngineInfo
from bot.kernel.config import LocalActuatorSpec

PORT, CANARY = 8000, 8001
REPLACED = ["--enforce-eager", "--max-num-batched-tokens", "8192"]
CHANGE: FlagValues = {
    "max-num-batched-tokens": 2048,
    "block-size": 32,
    "enable-chunked-prefill": True,
}


class Engines:
    """EngineManager's find, start and stop on a dict of ports (pid -1: no /proc to read)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.running: dict[int, EngineInfo] = {}
        self.started: list[tuple[int, list[str]]] = []

    def find(self, port: int) -> EngineInfo | None:
        return self.running.get(port)

    def start(self, *, port: int, host: str, flags: list[str], **_: Any) -> EngineInfo:
        self.started.append((port, list(flags)))
        self.running[port] = EngineInfo(port=port, pid=-1, host=host, flags=list(flags),
                                        log_path="")  # fmt: skip
        return self.running[port]

    def stop(self, port: int) -> None:
        self.running.pop(port, None)


@pytest.mark.parametrize("canary", [True, False])
async def test_stage_serves_the_recorded_launch_flags_without_the_added_ones(
    tmp_path: Path, canary: bool
) -> None:
    engines = Engines(tmp_path)
    engines.start(port=PORT, host="127.0.0.1", flags=REPLACED)
    url = f"http://127.0.0.1:{CANARY}" if canary else None
    spec = LocalActuatorSpec(kind="local", state_dir=tmp_path, canary_url=url)
    actuator = LocalActuator(spec, vllm_url=f"http://127.0.0.1:{PORT}", manager=engines)  # type: ignore[arg-type]
    replaced = await actuator.current()
    await actuator.apply(CHANGE)
    await actuator.promote(CHANGE)
    fixed = engines.running[PORT].flags
    assert read_flags(fixed) == read_flags(REPLACED) | CHANGE
    serving = await actuator.current()
    engines.started.clear()

    staged = await actuator.stage(replaced)
    where = CANARY if canary else PORT
    assert engines.started == [(where, REPLACED)]  # exactly the record: no flag of the change
    assert staged.flags == replaced.flags and staged.base_url.endswith(f":{where}")
    if canary:
        assert engines.running[PORT].flags == fixed  # the engine serving production untouched

    await actuator.rollback(serving)
    assert engines.running[PORT].flags == fixed and CANARY not in engines.running
