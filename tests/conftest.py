"""Shared fixtures: real vLLM engines (one per distinct flag set, per test session)."""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from bot.engine.process import EngineInfo, EngineManager, free_port
from tests import orphans
from tests.fakes.slack_api import FakeSlack

FIXTURES = Path(__file__).parent / "fixtures"
TEST_FLAGS = ("--enforce-eager",)  # same throughput on this tiny model, ready in ~25 s not ~75 s

EngineFactory = Callable[[Sequence[str]], EngineInfo]
# Seconds per module (setup + call + teardown) from the last recorded run, for the order below
# (`make durations` rewrites the file); a module not in it counts as 10 s.
MODULE_SECONDS_FILE = Path(__file__).with_name("module_seconds.json")
MODULE_SECONDS: dict[str, float] = (
    json.loads(MODULE_SECONDS_FILE.read_text()) if MODULE_SECONDS_FILE.exists() else {}
)
# RULELOOP_RECORD_DURATIONS=1 (`make durations`) writes this run's seconds per module there.
RECORD_DURATIONS = os.environ.get("RULELOOP_RECORD_DURATIONS") == "1"
_ran: dict[str, float] = {}


def pytest_configure(config: pytest.Config) -> None:
    """Stop what a killed earlier run left running, then own what this process starts."""
    orphans.reap()
    orphans.mark_owner()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add up each module's seconds (under xdist the controller hears every worker's)."""
    if RECORD_DURATIONS:
        module = Path(report.nodeid.split("::", 1)[0]).stem
        _ran[module] = _ran.get(module, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With RULELOOP_RECORD_DURATIONS=1, keep the seconds of the modules this run ran for the
    next run's order (on the controller only, and only when the run passed)."""
    if not RECORD_DURATIONS or hasattr(session.config, "workerinput") or exitstatus != 0:
        return
    ran = {module: round(seconds) for module, seconds in _ran.items()}
    MODULE_SECONDS_FILE.write_text(
        json.dumps(dict(sorted((MODULE_SECONDS | ran).items())), indent=0) + "\n"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest modules first. Under ``make test`` (pytest-xdist, ``--dist loadscope
    --no-loadscope-reorder``) each module runs on one worker, so the tests of a module that
    runs real engines share that worker's engines (one per flag set), and no worker is left
    with a long module at the end while the other idles. Sorted on every process: xdist's
    workers collect, and the order they report is the order the controller hands out.

    (``--dist loadgroup`` with marks would group only the engine modules, but with pytest 9
    xdist 3.8 cannot rename the node ids it groups by, and every module was split.)"""
    items.sort(key=lambda item: -MODULE_SECONDS.get(item.path.stem, 10))


@pytest.fixture(scope="module")
def box_alone() -> Iterator[None]:
    """Held for a whole module by the tests whose condition is "these engines run alike" or
    that load the box hardest (long prefills): with two xdist workers, two such modules never
    run at once, so one's prefills do not make the other's two 'equal' engines unequal. An
    exclusive lock on a file every worker of this machine sees."""
    path = Path(tempfile.gettempdir()) / "ruleloop-tests-box-alone.lock"
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def engine_manager(tmp_path_factory: pytest.TempPathFactory) -> EngineManager:
    """An engine manager whose state (logs, model dir) lives in this session's temp dir.

    RULELOOP_ENGINE_CPU_LIMIT=0.1 (read by every EngineManager) runs each engine the suite
    starts under a tenth of one core: the suite on a machine many times slower than this one.
    """
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
