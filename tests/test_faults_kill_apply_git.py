"""Item 4 of the reliability faults for the git actuator: `kill -9` of the replica running a
change at each step of a GitOps change, on real `ruleloop serve` processes sharing one real
PostgreSQL (as tests/test_faults_kill_apply.py does for the Kubernetes actuator).

The deployment repository is a real bare repository, changed with the `git` CLI; GitHub is
faked at the wire (`tests/fakes/forge_api.py`, merging in that repository); a GitOps
controller in this process renders the repository with `kubectl kustomize` every 0.2 s and
applies it to the fake Kubernetes API as Argo CD with selfHeal does. Replica A runs the change
and is killed with SIGKILL in one step: while measuring the baseline, with its branch pushed
but no pull request, with the pull request open, just after the forge merged it (A never
heard), during the canary, just after the promote's merge, and just after the merge of its
own revert (after a failed canary). Replica B, alive throughout, takes the change over.

Every change must end promoted, rolled back or (killed before anything was applied)
interrupted, with the Deployments serving what the repository says, no branch or pull request
left open, and main's history linear, explained (each commit names the ADR and the change in
its subject and trailers) and never reverting a commit twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.change.argv import read_flags
from bot.kernel.store.db import Database
from tests.fakes.forge_api import FORGE_TOKEN, FakeForge
from tests.fakes.gitops_controller import GitOpsController
from tests.fakes.kube_api import TOKEN, FakeKube
from tests.fakes.kube_server import KubeServer
from tests.fakes.slack_api import FakeSlack
from tests.fakes.sse_engine import SseEngine
from tests.gitops_fleet import ARGS_PATH, CANARY_FILE, MAIN_FILE, OVERLAY, Fleet
from tests.kill_apply import ADR, Cluster, replica_env, secret_file
from tests.test_bot_store import postgres  # noqa: F401  (the real PostgreSQL server fixture)
from tests.test_replicas import pg_url  # noqa: F401  (a fresh database on it)

pytestmark = [pytest.mark.slow, pytest.mark.faults]
DEPLOYMENTS = ("vllm", "vllm-canary")
ORIGINAL = ["--model", "/models/llama-3-8b", "--port", "8000", "--max-num-batched-tokens", "8192"]
APP = "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/vllm"


class GitCluster(Cluster):
    """The shared parts, plus the repository, the forge and the GitOps controller."""

    fleet: Fleet
    forge: FakeForge
    controller: GitOpsController
    api: KubeServer


def actuator(
    tmp_path: Path, *, kube: str, engine: str, fleet: Fleet, forge: FakeForge
) -> dict[str, Any]:
    """[targets.tiny.actuator]: the repository, the forge, the cluster and Argo CD."""
    return {"kind": "git", "repo_url": fleet.bare, "canary_url": engine,
            "workdir": tmp_path / "git-work", "poll_interval_s": 0.3, "rollout_timeout_s": 90,
            "locator": {"file": MAIN_FILE, "args": ARGS_PATH},
            "canary_locator": {"file": CANARY_FILE, "args": ARGS_PATH},
            "forge": {"kind": "github", "project": "acme/fleet", "api_url": forge.github_api,
                      "token_file": secret_file(tmp_path, "forge-token", FORGE_TOKEN)},
            "cluster": {"api_url": kube, "namespace": "inference", "deployment": "vllm",
                        "canary_deployment": "vllm-canary",
                        "token_file": secret_file(tmp_path, "kube-token", TOKEN)},
            "sync": {"kind": "argocd", "application": "vllm", "namespace": "argocd"}}  # fmt: skip


@pytest.fixture
async def cluster(tmp_path: Path, pg_url: str, slack: FakeSlack) -> AsyncIterator[GitCluster]:  # noqa: F811
    fleet = Fleet.create(tmp_path)
    kube = FakeKube()
    db = Database(pg_url)
    with KubeServer(kube) as api, FakeForge(fleet.bare) as forge:
        controller = GitOpsController(kube, bare=fleet.bare, path=OVERLAY, lock=api.lock,
                                      replicas=2).start(interval_s=0.2)  # fmt: skip
        try:
            async with SseEngine(metrics_pages=_pages(), count_generation=True) as engine:
                git = actuator(tmp_path, kube=api.url, engine=engine.base_url, fleet=fleet,
                               forge=forge)  # fmt: skip
                env = replica_env(tmp_path, engine=engine.base_url, actuator=git, pg_url=pg_url,
                                  slack=slack)  # fmt: skip
                c = GitCluster(tmp_path=tmp_path, db=db, kube=kube, engine=engine, slack=slack,
                               env=env)  # fmt: skip
                c.fleet, c.forge, c.controller, c.api = fleet, forge, controller, api
                async with c.survived():
                    yield c
        finally:
            controller.stop()
    db.dispose()


def _pages() -> list[str]:
    from tests.fakes.bot import PAGES

    return PAGES[:1]  # one page, its generation counter counting what the fake streamed


# name; the step A is killed in; the forge request it is killed at (event, before/after its
# work, the how-manieth); whether A's canary fails; how the change must end; how many fix
# commits landed on main and how many pull requests the survivor found open and closed
SCENARIOS = [
    ("no-kill", None, None, False, "promoted", 2, 0),
    ("approved", "approved", None, False, "interrupted", 0, 0),  # measuring the baseline
    ("branch-pushed", "applying", ("create", "before", 1), False, "rolled_back", 0, 0),
    ("pull-request-open", "applying", ("merge", "before", 1), False, "rolled_back", 0, 1),
    ("merged-not-yet-served", "applying", ("merge", "after", 1), False, "rolled_back", 1, 0),
    ("canary", "canary", None, False, "rolled_back", 1, 0),
    ("promote-merged", "promoting", ("merge", "after", 2), False, "rolled_back", 2, 0),
    ("revert-merged", "rolling_back", ("merge", "after", 2), True, "rolled_back", 1, 0),
    ("revert-branch-pushed", "rolling_back", ("create", "before", 2), True, "rolled_back", 1, 0),
]


@pytest.mark.parametrize(
    ("killed_in", "at", "canary_fails", "final", "landed", "closed"),
    [s[1:] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS],
)  # fmt: skip
async def test_kill_9_at_each_step_of_a_git_change_ends_promoted_or_reverted(
    cluster: GitCluster,
    killed_in: str | None,
    at: tuple[str, str, int] | None,
    canary_fails: bool,
    final: str,
    landed: int,
    closed: int,
) -> None:
    start = cluster.fleet.head()
    hold = cluster.forge.hold(at[0], when=at[1], nth=at[2]) if at is not None else None
    async with cluster.replica_a(canary_fails=canary_fails) as replica:
        rem_id = await cluster.request_and_approve(replica)
        if hold is not None:
            assert await asyncio.to_thread(hold.reached.wait, 180), "the forge never heard"
            rem = cluster.remediation(rem_id)
            assert rem is not None and rem.state == killed_in, rem.state if rem else None
        elif killed_in is not None:
            await cluster.until_state(rem_id, {killed_in}, timeout=90)
        if killed_in is not None:
            replica.kill_9()
        if hold is not None:
            hold.release()  # "before": the request is lost; "after": its answer goes nowhere
        state = await cluster.until_ended(rem_id, within_s=300)
    rem = cluster.ended(rem_id, state, killed_in=killed_in, final=final)
    assert_history(cluster, start, rem_id, final)
    history = cluster.fleet.history(start)
    assert len([e for e in history if not e.trailer("Ruleloop-Revert-Of")]) == landed, history
    states = [p.state for p in cluster.forge.pulls.values()]
    assert states.count("closed") == closed, states
    for created in cluster.forge.of("POST", "/pulls")[:1]:  # the pull request says why
        body = created.body["body"]
        assert f"**{ADR}**" in body and f"remediation #{rem_id}" in body, body
        assert "Requested by U1 in Slack, approved by U2." in body, body
        assert "Incident thread: http" in body and "Before the change, the canary measured" in body
    await assert_served(cluster, final)
    await cluster.card_says(rem, final)


def assert_history(cluster: GitCluster, start: str, rem_id: int, final: str) -> None:
    """main since the change: linear, every commit this change's and saying so, each fix
    reverted once (rolled back) or never (promoted); nothing left open."""
    fleet = cluster.fleet
    history = fleet.history(start)
    assert fleet.linear(), [(e.sha[:8], e.parents) for e in fleet.history()]
    for entry in history:
        assert entry.trailer("Ruleloop-Change") == [f"remediation-{rem_id}"], entry.message
        assert entry.trailer("Ruleloop-Target") == ["tiny"], entry.message
        assert entry.subject.startswith((f"{ADR} on tiny: ", f"ruleloop: revert {ADR} on tiny"))
    fixes = [e for e in history if not e.trailer("Ruleloop-Revert-Of")]
    reverted = [sha for e in history for sha in e.trailer("Ruleloop-Revert-Of")]
    assert len(reverted) == len(set(reverted)), reverted  # no commit reverted twice
    if final == "promoted":
        assert [e.trailer("Ruleloop-Stage") for e in reversed(fixes)] == [["canary"], ["main"]]
        assert reverted == []
    else:
        assert sorted(reverted) == sorted(e.sha for e in fixes)
        for path in (MAIN_FILE, CANARY_FILE):
            assert fleet.read(path) == fleet.read(path, start), path
        assert len([e for e in history if e.trailer("Ruleloop-Revert-Of")]) <= 1
    assert fleet.branches() == ["main"], fleet.branches()
    assert cluster.forge.open_pulls() == []


async def assert_served(cluster: GitCluster, final: str) -> None:
    """The Deployments run what main says, and Argo CD is Synced and Healthy at main's head."""
    deadline = time.monotonic() + 60
    while True:
        with cluster.api.lock:
            status = cluster.kube.custom[APP]["status"]
        if (status["sync"] == {"status": "Synced", "revision": cluster.fleet.head()}
                and status["health"]["status"] == "Healthy"):  # fmt: skip
            break
        assert time.monotonic() < deadline, status
        await asyncio.sleep(0.1)
    for name in DEPLOYMENTS:
        with cluster.api.lock:
            args = cluster.kube.args(name)
        if final == "promoted":
            assert read_flags(args) == {"max-num-batched-tokens": 2048, "block-size": 32,
                                        "enable-chunked-prefill": True}, (name, args)  # fmt: skip
            assert args[:4] == ORIGINAL[:4]  # the other arguments as they were
        else:
            assert args == ORIGINAL, (name, args)
