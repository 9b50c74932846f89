"""Shared fixtures: real vLLM engines (one per distinct flag set, per test session)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from bot.engine.process import EngineInfo, EngineManager, free_port
from tests.fakes.slack_api import FakeSlack

FIXTURES = Path(__file__).parent / "fixtures"
TEST_FLAGS = ("--enforce-eager",)  # same throughput on this tiny model, ready in ~25 s not ~75 s

EngineFactory = Callable[[Sequence[str]], EngineInfo]


@pytest.fixture(scope="session")
def engine_manager(tmp_path_factory: pytest.TempPathFactory) -> EngineManager:
    """An engine manager whose state (logs, model dir) lives in this session's temp dir."""
    return EngineManager(state_dir=tmp_path_factory.mktemp("engines"))


@pytest.fixture(scope="session")
def engine_factory(engine_manager: EngineManager) -> Iterator[EngineFactory]:
    """Start (once per session) an engine with the given extra vLLM flags; all stop at the end."""
    started: dict[tuple[str, ...], EngineInfo] = {}

    def get(flags: Sequence[str] = ()) -> EngineInfo:
        key = tuple(flags)
        if key not in started:
            # Generous: on a loaded 2-core box vLLM has taken over 5 minutes to become ready.
            started[key] = engine_manager.start(
                port=free_port(), flags=[*TEST_FLAGS, *key], timeout_s=600
            )
        return started[key]

    try:
        yield get
    finally:
        for info in started.values():
            engine_manager.stop(info.port)


@pytest.fixture(scope="session")
def engine(engine_factory: EngineFactory) -> EngineInfo:
    """The default test engine (vLLM defaults plus --enforce-eager)."""
    return engine_factory(())


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    """A local fake of the Slack Web API, recording every call."""
    with FakeSlack() as fake:
        yield fake
