"""The local vLLM engine: a real vLLM V1 engine on CPU with a tiny dummy-weight model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.engine.cpu_limit import ENV_VAR as ENV_VAR
    from bot.engine.cpu_limit import MAX_CORES as MAX_CORES
    from bot.engine.cpu_limit import MIN_CORES as MIN_CORES
    from bot.engine.process import DEFAULT_PORT as DEFAULT_PORT
    from bot.engine.process import START_TIMEOUT_S as START_TIMEOUT_S
    from bot.engine.process import EngineInfo as EngineInfo
    from bot.engine.process import EngineManager as EngineManager
    from bot.engine.process import default_state_dir as default_state_dir
    from bot.engine.process import free_port as free_port

__all__ = [
    "DEFAULT_PORT",
    "ENV_VAR",
    "EngineInfo",
    "EngineManager",
    "MAX_CORES",
    "MIN_CORES",
    "START_TIMEOUT_S",
    "default_state_dir",
    "free_port",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
