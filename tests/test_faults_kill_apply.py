"""Item 4 of the reliability faults, end to end: `kill -9` of the replica running a change, at each
step of the apply, on real `ruleloop serve` processes sharing one real PostgreSQL.

Replica A takes the request and the approval and runs the change; it is killed with SIGKILL
while the change is in one step (approved and measuring the baseline, applying, canary,
promoting, rolling back after a failed canary). Replica B, alive throughout, finds the change
silent past `stale_after_s` and rolls it back. Every change must end promoted, rolled back or
(killed before anything was applied) interrupted, with the Deployments' args verified against
what they were and an audit trail that is one consistent story. The Kubernetes API is the fake
at the wire (over HTTP), the engine a fake that streams tokens and serves recorded /metrics
pages, so the canary is the real one and passes or fails by the engine's token pace.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.change.argv import read_flags
from bot.kernel.store.db import Database
from tests.fakes.bot import PAGES
from tests.fakes.kube_api import TOKEN, FakeKube
from tests.fakes.kube_server import KubeServer
from tests.fakes.slack_api import FakeSlack
from tests.fakes.sse_engine import SseEngine
from tests.kill_apply import Cluster, replica_env, secret_file
from tests.test_bot_store import postgres  # noqa: F401  (the real PostgreSQL server fixture)
from tests.test_replicas import pg_url  # noqa: F401  (a fresh database on it)

pytestmark = [pytest.mark.slow, pytest.mark.faults]
ARGS = ["--model", "/models/llama-3-8b", "--api-key", "sk-secret", "--max-num-batched-tokens",
        "8192"]  # fmt: skip
DEPLOYMENTS = ("vllm", "vllm-canary")


def actuator(tmp_path: Path, *, kube: str, engine: str) -> dict[str, Any]:
    """[targets.tiny.actuator]: the Kubernetes API's fake, over HTTP."""
    return {"kind": "kubernetes", "api_url": kube, "namespace": "inference", "deployment": "vllm",
            "canary_deployment": "vllm-canary", "canary_url": engine,
            "token_file": secret_file(tmp_path, "kube-token", TOKEN), "poll_interval_s": 0.4,
            "rollout_timeout_s": 60}  # fmt: skip


@pytest.fixture
async def cluster(tmp_path: Path, pg_url: str, slack: FakeSlack) -> AsyncIterator[Cluster]:  # noqa: F811
    kube = FakeKube()
    for name in DEPLOYMENTS:
        kube.add_deployment(name, args=ARGS, replicas=2)
    db = Database(pg_url)
    with KubeServer(kube) as api:
        # one recorded page whose generation counter counts what the fake streamed: goodput is
        # the canary's own tokens against the engine's count, as on a real engine
        async with SseEngine(metrics_pages=PAGES[:1], count_generation=True) as engine:
            kubernetes = actuator(tmp_path, kube=api.url, engine=engine.base_url)
            env = replica_env(tmp_path, engine=engine.base_url, actuator=kubernetes,
                              pg_url=pg_url, slack=slack)  # fmt: skip
            c = Cluster(tmp_path=tmp_path, db=db, kube=kube, engine=engine, slack=slack, env=env)
            async with c.survived():
                yield c
    db.dispose()


# the step to kill replica A in; whether A's canary fails; how the change must end
SCENARIOS = [
    (None, False, "promoted"),
    ("approved", False, "interrupted"),  # measuring the baseline: nothing applied yet
    ("applying", False, "rolled_back"),
    ("canary", False, "rolled_back"),
    ("promoting", False, "rolled_back"),
    ("rolling_back", True, "rolled_back"),  # A's own rollback after a failed canary
]


@pytest.mark.parametrize(
    ("killed_in", "canary_fails", "final"), SCENARIOS, ids=[s[0] or "no-kill" for s in SCENARIOS]
)
async def test_kill_9_at_each_step_of_apply_ends_in_one_consistent_state(
    cluster: Cluster, killed_in: str | None, canary_fails: bool, final: str
) -> None:
    async with cluster.replica_a(canary_fails=canary_fails) as replica:
        rem_id = await cluster.request_and_approve(replica)
        if killed_in is not None:
            await cluster.until_state(rem_id, {killed_in}, timeout=60)
            replica.kill_9()
        state = await cluster.until_ended(rem_id, within_s=240)
    rem = cluster.ended(rem_id, state, killed_in=killed_in, final=final)
    for name in DEPLOYMENTS:
        args = cluster.kube.args(name)
        if final == "promoted":
            assert read_flags(args)["max-num-batched-tokens"] == 2048 and "sk-secret" in args
        else:  # rolled back (or never changed): exactly the args it had, secret included
            assert args == ARGS, (name, args)
    assert cluster.kube.rolled_out("vllm") and cluster.kube.rolled_out("vllm-canary")
    await cluster.card_says(rem, final)
