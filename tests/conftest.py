"""Shared fixtures: real vLLM engines (one per distinct flag set, per test session)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from bot.engine.process import EngineInfo, EngineManager, free_port
from tests.fakes.slack_api import FakeSlack

FIXTURES = Path(__file__).parent / "fixtures"
TEST_FLAGS = ("--enforce-eager",)  # same throughput on this tiny model, ready in ~25 s not ~75 s

EngineFactory = Callable[[Sequence[str]], EngineInfo]
ENGINE_FIXTURES = {"engine", "engine_factory", "engine_manager", "long_engine"}
# Seconds per module in a serial run (`--durations=0`, 2-core box), for the order below; a
# module not listed counts as 10 s.
MODULE_SECONDS = {
    "test_engine_cli": 405, "test_remediation_engine": 196, "test_gateway_engine": 115,
    "test_canary_gateway_engine": 110, "test_faults_kill_apply": 103, "test_tune": 103,
    "test_bot_e2e": 83, "test_replicas": 60, "test_canary_engine": 48,
    "test_fuzz_alertmanager": 38, "test_engine_process": 34, "test_bot_transports": 28,
    "test_faults_slack": 18, "test_faults_delivery": 14, "test_gateway_app": 13,
    "test_goodput_engine": 15, "test_fuzz_slack": 40, "test_workload_drift_engine": 45,
    "test_workload_fidelity_engine": 41,
}  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``make test`` (pytest-xdist, ``--dist loadgroup``): the tests of a module that runs
    real engines stay together on one worker, sharing that worker's engines (one per flag
    set), and the longest modules go first, so that no worker is left with one at the end
    while the other idles. Other tests spread over the workers one by one."""
    if not getattr(config.option, "numprocesses", None):
        return
    for item in items:
        uses_engine = ENGINE_FIXTURES & set(getattr(item, "fixturenames", ()))
        if uses_engine or item.get_closest_marker("engine"):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else ""))
    items.sort(key=lambda item: -MODULE_SECONDS.get(item.path.stem, 10))


# RULELOOP_TEST_ENGINE_CPU_LIMIT=0.1 runs every test engine under a tenth of one core (a cgroup
# quota, root only): the engine modules on a machine many times slower than this one.
ENGINE_CPU_LIMIT = os.environ.get("RULELOOP_TEST_ENGINE_CPU_LIMIT")


@pytest.fixture(scope="session")
def engine_manager(tmp_path_factory: pytest.TempPathFactory) -> EngineManager:
    """An engine manager whose state (logs, model dir) lives in this session's temp dir."""
    return EngineManager(
        state_dir=tmp_path_factory.mktemp("engines"),
        cpu_limit=float(ENGINE_CPU_LIMIT) if ENGINE_CPU_LIMIT else None,
    )


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
