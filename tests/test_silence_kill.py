"""Issue 31's silences, killed for real: with `[targets.tiny.silence]` set, replica A (a real
`ruleloop serve` process) silences the target at a REAL Alertmanager before it applies and is
killed with SIGKILL mid-change; replica B, alive throughout on the same PostgreSQL, resumes the
dead run, rolls it back and expires the silence A left (docs/remediation.md#silences: "a
silence is never left behind").

The harness is tests/kill_apply.py's (the Kubernetes API's fake over HTTP, an engine that
streams tokens at a set pace, so the canary is the real one). A kill leaves the silence active
with A's id on the record; a resume that forgot to expire it leaves it active until its end
(`change_s` + `settle_s`, here over an hour), so the test fails (tried by breaking
`ChangeSilencer._expire`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.kernel.store.db import Database
from bot.kernel.store.models import Remediation
from tests.fakes.bot import PAGES
from tests.fakes.kube_api import FakeKube
from tests.fakes.kube_server import KubeServer
from tests.fakes.slack_api import FakeSlack
from tests.fakes.sse_engine import SseEngine
from tests.kill_apply import Cluster, assert_one_story, replica_env
from tests.test_bot_store import postgres  # noqa: F401  (the real PostgreSQL server fixture)
from tests.test_faults_kill_apply import (
    ARGS,
    DEPLOYMENTS,
    actuator,
    am,  # noqa: F401  (a real Alertmanager)
)
from tests.test_replicas import pg_url  # noqa: F401  (a fresh database on it)

pytestmark = [pytest.mark.slow, pytest.mark.faults]
# an end far past the test: only an expiry ends it, never its own end
SILENCE = {"change_s": 3600, "settle_s": 300}
MATCHERS = [{"name": "ruleloop_target", "value": "tiny", "isRegex": False, "isEqual": True}]


@pytest.fixture
async def cluster(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
    slack: FakeSlack,
    am: str,  # noqa: F811
) -> AsyncIterator[Cluster]:
    kube = FakeKube()
    for name in DEPLOYMENTS:
        kube.add_deployment(name, args=ARGS, replicas=2)
    db = Database(pg_url)
    with KubeServer(kube) as api:
        async with SseEngine(metrics_pages=PAGES[:1], count_generation=True) as engine:
            kubernetes = actuator(tmp_path, kube=api.url, engine=engine.base_url)
            env = replica_env(tmp_path, engine=engine.base_url, actuator=kubernetes,
                              pg_url=pg_url, slack=slack,
                              silence={"alertmanager_url": am, **SILENCE})  # fmt: skip
            c = Cluster(tmp_path=tmp_path, db=db, kube=kube, engine=engine, slack=slack, env=env)
            async with c.survived():
                yield c
    db.dispose()


def silences(am: str) -> list[dict[str, Any]]:  # noqa: F811
    return list(httpx.get(f"{am}/api/v2/silences", timeout=10).json())


async def expired_on_record(cluster: Cluster, rem_id: int, *, within_s: float) -> Remediation:
    """The change once its record says its silence is expired; fails after ``within_s`` (a
    bound on waiting, not a timing assertion) with what the record says then."""
    deadline = time.monotonic() + within_s
    while True:
        rem = cluster.remediation(rem_id)
        assert rem is not None
        if (rem.silence or {}).get("expired"):
            return rem
        assert time.monotonic() < deadline, f"silence never expired: {rem.silence}"
        await asyncio.sleep(0.1)


# the step A is killed in (each after the silence is created); whether A's canary fails
SCENARIOS = [("applying", False), ("canary", False), ("rolling_back", True)]


@pytest.mark.parametrize(("killed_in", "canary_fails"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
async def test_kill_9_mid_change_leaves_no_silence_behind(
    cluster: Cluster,
    am: str,  # noqa: F811
    killed_in: str,
    canary_fails: bool,
) -> None:
    async with cluster.replica_a(canary_fails=canary_fails) as replica:
        rem_id = await cluster.request_and_approve(replica)
        await cluster.until_state(rem_id, {killed_in}, timeout=60)
        replica.kill_9()
        # what A left: its silence, active, on the record (the premise of the test)
        [left] = silences(am)
        rem = cluster.remediation(rem_id)
        assert rem is not None and rem.silence is not None
        assert rem.silence["id"] == left["id"] and not rem.silence.get("expired"), rem.silence
        assert left["status"]["state"] == "active" and left["matchers"] == MATCHERS
        assert f"change #{rem_id}" in left["comment"]
        state = await cluster.until_ended(rem_id, within_s=240)
    assert state == "rolled_back", (cluster.remediation(rem_id) or rem).result
    trail = cluster.trail(rem_id)
    # the change is one story (its silence entries aside), rolled back by B
    assert_one_story([e for e in trail if "silence" not in e.action], killed_in, "rolled_back")
    # B expires it just after its rolled_back step: wait for the record to say so (bounded)
    rem = await expired_on_record(cluster, rem_id, within_s=60)
    assert rem.silence is not None and rem.silence["id"] == left["id"], rem.silence
    [after] = silences(am)  # the same silence, expired at Alertmanager; none new
    assert after["id"] == left["id"] and after["status"]["state"] == "expired", after
    trail = cluster.trail(rem_id)
    silenced = [e.action.removeprefix("remediation.") for e in trail if "silence" in e.action]
    assert silenced == ["silenced", "silence_expired"], silenced
    resumed = next(e for e in trail if e.action == "remediation.resumed")
    expired = next(e for e in trail if e.action == "remediation.silence_expired")
    assert expired.id > resumed.id  # B expired it, after taking the change over
