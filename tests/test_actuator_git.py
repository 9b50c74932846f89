"""The git actuator against real parts: a bare repository and the `git` CLI, GitHub and GitLab
faked at the wire (merging in that repository), and a GitOps controller that renders it with
`kubectl kustomize` into the fake Kubernetes API, as Argo CD or Flux does."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.change.actuators.base import ActuatorError, ChangeContext, Deployed
from bot.change.actuators.git import GitActuator
from bot.change.argv import merge, read_flags
from tests.fakes.forge_api import FORGE_TOKEN, Pull
from tests.gitops_fleet import CANARY_FILE, MAIN_FILE, git
from tests.gitops_rig import CANARY_URL, VLLM_URL, Rig, make_rig

CHANGE = {"max-num-batched-tokens": 2048}
LINK = "https://acme.slack.com/archives/C0INCIDENTS/p1700000000000100"


def context(before: Deployed, change_id: str = "remediation-7", reason: str = "") -> ChangeContext:
    return ChangeContext(
        change_id=change_id, title="ADR-20260831-01 on prod-a",
        description=f"ruleloop applies **ADR-20260831-01**.\n\nIncident thread: {LINK}\n\n"
        "Before the change, the canary measured:\n- TTFT p99: 812.0 ms",
        before=before, reason=reason,
    )  # fmt: skip


async def prepared(rig: Rig, **settings: Any) -> tuple[GitActuator, Deployed]:
    act = rig.actuator(**settings)
    before = await act.current()
    act.prepare(context(before))
    return act, before


def ours(rig: Rig, since: str) -> list[str]:
    """Subjects of main's commits since ``since``, oldest first."""
    return [e.subject for e in reversed(rig.fleet.history(since))]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    yield from make_rig(tmp_path)


@pytest.fixture
def flux_rig(tmp_path: Path) -> Iterator[Rig]:
    yield from make_rig(tmp_path, kind="flux")


async def test_current_reads_the_file_at_the_head_and_the_live_deployments(rig: Rig) -> None:
    before = await rig.actuator().current()
    assert before.flags == {"max-num-batched-tokens": 8192}
    assert before.base_url == CANARY_URL  # canary load goes to the canary, as with kubernetes
    detail = before.detail
    assert detail["head"] == rig.fleet.head() and detail["actuator"] == "git"
    assert detail["canary"]["file"] == CANARY_FILE and detail["main"]["file"] == MAIN_FILE
    assert detail["main"]["file_flags"] == {"max-num-batched-tokens": 8192}
    # other arguments are kept as blanks and a hash: they may be secrets
    assert "/models/llama-3-8b" not in str(detail)
    assert Deployed.from_json(before.to_json()) == before


async def test_apply_is_a_merged_pull_request_the_cluster_then_serves(rig: Rig) -> None:
    act, before = await prepared(rig)
    start = rig.fleet.head()
    applied = await act.apply(merge(before.flags, CHANGE))
    assert applied.flags == {"max-num-batched-tokens": 2048} and applied.base_url == CANARY_URL
    assert read_flags(rig.args("vllm-canary"))["max-num-batched-tokens"] == 2048
    assert read_flags(rig.args("vllm"))["max-num-batched-tokens"] == 8192  # not promoted yet
    (commit,) = rig.fleet.history(start)
    assert commit.subject == "ADR-20260831-01 on prod-a: --max-num-batched-tokens=2048 (canary)"
    assert commit.trailer("Ruleloop-Change") == ["remediation-7"]
    assert commit.trailer("Ruleloop-Stage") == ["canary"]
    assert rig.fleet.linear() and rig.fleet.branches() == ["main"]  # the branch was deleted
    # the pull request says why, and was merged at exactly the pushed commit
    (created,) = rig.forge.of("POST", "/pulls")
    assert created.status == 201 and LINK in created.body["body"]
    assert "812.0 ms" in created.body["body"] and "ADR-20260831-01" in created.body["title"]
    (merged,) = rig.forge.of("PUT", "/merge")
    assert merged.status == 200 and merged.body["merge_method"] == "rebase"
    assert [p.state for p in rig.forge.pulls.values()] == ["merged"]
    # a minimal edit: the one value changed, comments and quoting kept
    old, new = (
        rig.fleet.read(CANARY_FILE, start).splitlines(),
        rig.fleet.read(CANARY_FILE).splitlines(),
    )
    changed = [(a, b) for a, b in zip(old, new, strict=True) if a != b]
    assert changed == [('            - "8192"', '            - "2048"')]
    # Argo CD deployed that commit and says so
    status = rig.kube.custom["/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/vllm"]
    assert status["status"]["sync"] == {"status": "Synced", "revision": rig.fleet.head()}


async def test_promote_then_rollback_reverts_both_commits_once_and_serves_the_old_flags(
    rig: Rig,
) -> None:
    act, before = await prepared(rig)
    start = rig.fleet.head()
    flags = merge(before.flags, CHANGE)
    await act.apply(flags)
    promoted = await act.promote(flags)
    assert promoted.flags == {"max-num-batched-tokens": 2048}
    assert read_flags(rig.args("vllm"))["max-num-batched-tokens"] == 2048
    fixes = [e.sha for e in rig.fleet.history(start)]
    act.prepare(context(before, reason="canary failed the gates: TPOT p99 61 ms > 35 ms"))
    back = await act.rollback(before)
    assert back.flags == {"max-num-batched-tokens": 8192}
    for name in ("vllm", "vllm-canary"):
        assert read_flags(rig.args(name))["max-num-batched-tokens"] == 8192
    revert = rig.fleet.history(start)[0]
    assert revert.subject == "ruleloop: revert ADR-20260831-01 on prod-a"
    assert sorted(revert.trailer("Ruleloop-Revert-Of")) == sorted(fixes)
    assert "TPOT p99 61 ms" in revert.message  # the commit says why
    assert rig.fleet.read(CANARY_FILE) == rig.fleet.read(CANARY_FILE, start)
    assert rig.fleet.read(MAIN_FILE) == rig.fleet.read(MAIN_FILE, start)
    # rolling back again (a replica that takes over later) reverts nothing twice
    await rig.actuator().rollback(before)
    assert len(rig.fleet.history(start)) == 3 and rig.fleet.linear()
    assert rig.fleet.branches() == ["main"] and not rig.forge.open_pulls()


async def test_stage_commits_the_recorded_flags_to_the_canary_only(rig: Rig) -> None:
    act, replaced = await prepared(rig)
    flags = merge(replaced.flags, CHANGE)
    await act.apply(flags)
    await act.promote(flags)
    staged = await rig.actuator().stage(replaced)  # a drift before-run: no change's context
    assert staged.flags == {"max-num-batched-tokens": 8192} and staged.base_url == CANARY_URL
    assert read_flags(rig.args("vllm-canary")) == {"max-num-batched-tokens": 8192}
    assert read_flags(rig.args("vllm")) == {"max-num-batched-tokens": 2048}


async def test_stage_refuses_what_a_file_edit_cannot_remove(rig: Rig) -> None:
    act, replaced = await prepared(rig)
    flags = merge(replaced.flags, {**CHANGE, "block-size": 32})
    await act.apply(flags)
    await act.promote(flags)
    head = rig.fleet.head()
    with pytest.raises(ActuatorError, match=r"it runs --block-size, which the record has not"):
        await rig.actuator().stage(replaced)
    assert rig.fleet.head() == head  # nothing committed: it would serve a mix of both
    assert read_flags(rig.args("vllm-canary")) == {"max-num-batched-tokens": 2048, "block-size": 32}


async def test_someone_changing_the_file_since_current_is_refused_before_anything_is_pushed(
    rig: Rig,
) -> None:
    act, before = await prepared(rig)
    text = rig.fleet.read(CANARY_FILE).replace('"8192"', '"4096"')
    theirs = rig.fleet.commit(CANARY_FILE, text, "canary: try 4096 tokens per step")
    with pytest.raises(ActuatorError) as refused:
        await act.apply(merge(before.flags, CHANGE))
    message = str(refused.value)
    assert f"{CANARY_FILE} changed since ruleloop read it: {theirs[:12]}" in message
    assert "nothing was changed" in message and "Request the change again" in message
    assert rig.fleet.head() == theirs and rig.fleet.branches() == ["main"]
    assert not rig.forge.calls  # no pull request was even opened
    # an unrelated file changing is no conflict
    rig.fleet.commit("README.md", "the fleet\n", "docs: a readme")
    other = rig.actuator()
    fresh = await other.current()
    other.prepare(context(fresh, change_id="remediation-8"))
    rig.fleet.commit("NOTES.md", "notes\n", "docs: notes")
    applied = await other.apply(merge(fresh.flags, CHANGE))
    assert applied.flags == {"max-num-batched-tokens": 2048}


@pytest.mark.parametrize("forge", ["github", "gitlab"])
async def test_a_pull_request_branch_changed_before_the_merge_is_refused_and_cleaned_up(
    rig: Rig, forge: str
) -> None:
    act, before = await prepared(rig, forge=forge)
    start = rig.fleet.head()

    def someone_pushes_to_the_branch(pull: Pull) -> None:
        work = rig.tmp_path / "bob"
        git("clone", "-q", "-b", pull.head, str(rig.fleet.bare), str(work), cwd=rig.tmp_path)
        (work / "extra.txt").write_text("mine\n")
        git("add", "extra.txt", cwd=work)
        git("commit", "-q", "-m", "piggyback", cwd=work)
        git("push", "-q", "origin", pull.head, cwd=work)

    rig.forge.before_merge.append(someone_pushes_to_the_branch)
    with pytest.raises(ActuatorError, match="changed since ruleloop pushed it \\(409") as refused:
        await act.apply(merge(before.flags, CHANGE))
    assert "Nothing was left behind" in str(refused.value)
    assert [c.status for c in rig.forge.of("PUT", "/merge")] == [409]
    assert [p.state for p in rig.forge.pulls.values()] == ["closed"]
    assert rig.fleet.branches() == ["main"] and rig.fleet.head() == start
    assert read_flags(rig.args("vllm-canary"))["max-num-batched-tokens"] == 8192


@pytest.mark.parametrize(("forge", "status"), [("github", 405), ("gitlab", 406)])
async def test_a_pull_request_that_cannot_merge_is_refused_and_cleaned_up(
    rig: Rig, forge: str, status: int
) -> None:
    act, before = await prepared(rig, forge=forge)

    def conflicting_push(_pull: Pull) -> None:
        # GitHub: the same line changed on main, so the rebase conflicts; GitLab (merging by
        # fast-forward only): main moved at all
        text = rig.fleet.read(CANARY_FILE).replace('"8192"', '"1024"')
        rig.fleet.commit(CANARY_FILE, text, "canary: 1024")

    rig.forge.before_merge.append(conflicting_push)
    with pytest.raises(ActuatorError, match=f"will not merge .*\\({status} ") as refused:
        await act.apply(merge(before.flags, CHANGE))
    assert "Nothing was left behind" in str(refused.value)
    assert [p.state for p in rig.forge.pulls.values()] == ["closed"]
    assert rig.fleet.branches() == ["main"]
    assert [e.subject for e in rig.fleet.history()][0] == "canary: 1024"


async def test_gitlab_merges_by_fast_forward_and_removes_the_branch(rig: Rig) -> None:
    act, before = await prepared(rig, forge="gitlab")
    start = rig.fleet.head()
    await act.apply(merge(before.flags, CHANGE))
    (created,) = rig.forge.of("POST", "/merge_requests")
    assert created.status == 201 and created.headers["private-token"] == FORGE_TOKEN
    assert "authorization" not in created.headers  # GitLab's own header, not GitHub's
    (commit,) = rig.fleet.history(start)
    assert commit.trailer("Ruleloop-Stage") == ["canary"] and rig.fleet.branches() == ["main"]
    assert read_flags(rig.args("vllm-canary"))["max-num-batched-tokens"] == 2048


async def test_squash_merges_keep_the_trailers_ruleloop_finds_its_commits_by(rig: Rig) -> None:
    act, before = await prepared(rig, forge_settings={"merge_method": "squash"})
    start = rig.fleet.head()
    await act.apply(merge(before.flags, CHANGE))
    (merged,) = rig.forge.of("PUT", "/merge")
    assert merged.body["merge_method"] == "squash"
    (commit,) = rig.fleet.history(start)
    assert commit.trailer("Ruleloop-Change") == ["remediation-7"]
    await act.rollback(before)
    assert rig.fleet.history(start)[0].trailer("Ruleloop-Revert-Of") == [commit.sha]


async def test_direct_push_commits_to_the_branch_without_a_pull_request(rig: Rig) -> None:
    act, before = await prepared(rig, forge=None)
    start = rig.fleet.head()
    await act.apply(merge(before.flags, CHANGE))
    await act.rollback(before)
    assert [e.subject for e in reversed(rig.fleet.history(start))] == [
        "ADR-20260831-01 on prod-a: --max-num-batched-tokens=2048 (canary)",
        "ruleloop: revert ADR-20260831-01 on prod-a",
    ]
    assert not rig.forge.calls and rig.fleet.linear()


async def test_flux_kustomization_ready_at_the_commit_is_what_apply_waits_for(
    flux_rig: Rig,
) -> None:
    rig = flux_rig
    act, before = await prepared(rig, sync="flux")
    applied = await act.apply(merge(before.flags, CHANGE))
    assert applied.flags == {"max-num-batched-tokens": 2048}
    path = "/apis/kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/vllm"
    status = rig.kube.custom[path]["status"]
    assert status["lastAppliedRevision"] == f"main@sha1:{rig.fleet.head()}"
    assert status["conditions"][0]["status"] == "True"


async def test_a_rollout_that_never_becomes_healthy_fails_apply_with_what_it_waited_for(
    rig: Rig,
) -> None:
    act, before = await prepared(rig)
    with rig.api.lock:
        rig.kube.stall("vllm-canary", deadline_after=2)
    with pytest.raises(ActuatorError, match="Degraded after syncing") as failed:
        await act.apply(merge(before.flags, CHANGE))
    assert "Argo CD Application argocd/vllm" in str(failed.value)
    # the service then rolls back: the revert lands (the stalled rollout goes with it)
    await rig.actuator().rollback(before)
    assert rig.fleet.history()[0].subject == "ruleloop: revert ADR-20260831-01 on prod-a"


async def test_a_cluster_that_never_serves_the_commit_times_out_naming_the_application(
    rig: Rig,
) -> None:
    act, before = await prepared(rig, rollout_timeout_s=5.0)
    rig.controller.self_heal = False
    rig.controller.reconcile = lambda: None  # type: ignore[method-assign]  # Argo CD is down
    with pytest.raises(ActuatorError) as failed:
        await act.apply(merge(before.flags, CHANGE))
    message = str(failed.value)
    assert "is on main (commit" in message and "does not serve it after 5 s" in message
    assert "Argo CD Application argocd/vllm to sync commit" in message


async def test_forge_approvals_are_waited_for_then_merged(rig: Rig) -> None:
    rig.forge.required_approvals = 1
    polls = 0

    async def a_reviewer_approves(seconds: float) -> None:
        nonlocal polls
        polls += 1
        if polls == 2 and rig.forge.open_pulls():
            rig.forge.approve("github", 1)
        await rig.sleep(seconds)

    act, before = await prepared(rig, sleep=a_reviewer_approves,
                                 forge_settings={"approvals": "forge"})  # fmt: skip
    await act.apply(merge(before.flags, CHANGE))
    assert [p.state for p in rig.forge.pulls.values()] == ["merged"]
    assert polls >= 2


async def test_forge_approvals_that_never_come_close_the_pull_request(rig: Rig) -> None:
    rig.forge.required_approvals = 1
    act, before = await prepared(
        rig, forge_settings={"approvals": "forge", "approval_timeout_s": 60.0}
    )
    with pytest.raises(ActuatorError, match="was not approved within 60 s"):
        await act.apply(merge(before.flags, CHANGE))
    assert [p.state for p in rig.forge.pulls.values()] == ["closed"]
    assert rig.fleet.branches() == ["main"] and not rig.forge.of("PUT", "/merge")


# --- rollback from any point (what a replica taking over after kill -9 finds) -----------------


async def leftover(rig: Rig, branch: str, file: str, *, open_pr: bool) -> None:
    """What a replica killed mid-change leaves: its branch pushed, maybe its pull request."""
    work = rig.tmp_path / "dead-replica"
    git("clone", "-q", str(rig.fleet.bare), str(work), cwd=rig.tmp_path)
    git("checkout", "-q", "-b", branch, cwd=work)
    (work / file).write_text((work / file).read_text().replace('"8192"', '"2048"'))
    git("commit", "-q", "-am", "ADR-20260831-01 on prod-a: --max-num-batched-tokens=2048\n\n"
        "Ruleloop-Change: remediation-7\nRuleloop-Target: prod-a", cwd=work)  # fmt: skip
    git("push", "-q", "origin", branch, cwd=work)
    if open_pr:
        async with httpx.AsyncClient() as client:
            answer = await client.post(
                f"{rig.forge.github_api}/repos/acme/fleet/pulls",
                headers={"Authorization": f"Bearer {FORGE_TOKEN}"},
                json={"title": "t", "head": branch, "base": "main", "body": ""},
            )
        assert answer.status_code == 201


@pytest.mark.parametrize("open_pr", [False, True], ids=["branch-only", "pull-request-open"])
async def test_rollback_of_a_fix_that_never_landed_only_cleans_up(rig: Rig, open_pr: bool) -> None:
    before = await rig.actuator().current()
    start = rig.fleet.head()
    await leftover(rig, "ruleloop/prod-a/remediation-7/canary", CANARY_FILE, open_pr=open_pr)
    act = rig.actuator()
    act.prepare(context(before))
    back = await act.rollback(before)
    assert back.flags == {"max-num-batched-tokens": 8192}
    assert rig.fleet.head() == start  # no commit: nothing had landed
    assert rig.fleet.branches() == ["main"] and not rig.forge.open_pulls()
    assert [p.state for p in rig.forge.pulls.values()] == (["closed"] if open_pr else [])


async def test_rollback_killed_with_its_revert_pull_request_open_lands_one_revert(rig: Rig) -> None:
    act, before = await prepared(rig)
    start = rig.fleet.head()
    await act.apply(merge(before.flags, CHANGE))
    # the dying replica pushed its revert branch and opened the pull request, never merged it
    fix = rig.fleet.history(start)[0].sha
    work = rig.tmp_path / "dying"
    git("clone", "-q", str(rig.fleet.bare), str(work), cwd=rig.tmp_path)
    git("checkout", "-q", "-b", "ruleloop/prod-a/remediation-7/revert", cwd=work)
    git("revert", "--no-edit", fix, cwd=work)
    git("push", "-q", "origin", "ruleloop/prod-a/remediation-7/revert", cwd=work)
    async with httpx.AsyncClient() as client:
        await client.post(
            f"{rig.forge.github_api}/repos/acme/fleet/pulls",
            headers={"Authorization": f"Bearer {FORGE_TOKEN}"},
            json={"title": "revert", "head": "ruleloop/prod-a/remediation-7/revert",
                  "base": "main", "body": ""},
        )  # fmt: skip
    survivor = rig.actuator()
    survivor.prepare(context(before))
    await survivor.rollback(before)
    reverts = [e for e in rig.fleet.history(start) if e.trailer("Ruleloop-Revert-Of")]
    assert len(reverts) == 1 and reverts[0].trailer("Ruleloop-Revert-Of") == [fix]
    assert [p.state for p in rig.forge.pulls.values()] == ["merged", "closed", "merged"]
    assert rig.fleet.branches() == ["main"] and rig.fleet.linear()
    assert read_flags(rig.args("vllm-canary"))["max-num-batched-tokens"] == 8192


async def test_a_fix_reverted_once_is_never_reverted_again_even_if_a_person_redid_it(
    rig: Rig,
) -> None:
    act, before = await prepared(rig)
    start = rig.fleet.head()
    await act.apply(merge(before.flags, CHANGE))
    await act.rollback(before)
    # a person puts the same value back by hand: a late rollback must leave their commit alone
    text = rig.fleet.read(CANARY_FILE).replace('"8192"', '"2048"')
    theirs = rig.fleet.commit(CANARY_FILE, text, "canary: 2048 again, by hand")
    late = rig.actuator()
    late.prepare(context(before))
    with pytest.raises(ActuatorError) as kept:
        await late.rollback(before)
    assert "now sets --max-num-batched-tokens=2048 in " + CANARY_FILE in str(kept.value)
    assert "someone committed that since" in str(kept.value)
    assert rig.fleet.head() == theirs
    assert read_flags(rig.args("vllm-canary"))["max-num-batched-tokens"] == 2048
    reverts = [e for e in rig.fleet.history(start) if e.trailer("Ruleloop-Revert-Of")]
    assert len(reverts) == 1


async def test_a_revert_that_no_longer_applies_cleanly_fails_with_what_to_do(rig: Rig) -> None:
    act, before = await prepared(rig)
    start = rig.fleet.head()
    await act.apply(merge(before.flags, CHANGE))
    fix = rig.fleet.history(start)[0].sha
    text = rig.fleet.read(CANARY_FILE).replace('"2048"', '"1024"')
    rig.fleet.commit(CANARY_FILE, text, "canary: 1024 instead")
    with pytest.raises(ActuatorError) as failed:
        await rig.actuator().rollback(before)
    message = str(failed.value)
    assert (
        "no longer reverts cleanly" in message and f"revert {fix[:12]} on main by hand" in message
    )
    assert "Nothing was pushed" in message and rig.fleet.branches() == ["main"]


async def test_a_record_from_another_actuator_is_refused(rig: Rig) -> None:
    with pytest.raises(ActuatorError, match="not made by the git actuator"):
        await rig.actuator().rollback(Deployed(flags={}, base_url=VLLM_URL, detail={"argv": {}}))


# --- credentials ---------------------------------------------------------------------------------


async def test_the_forge_token_is_sent_but_never_in_logs_messages_or_commits(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    act, before = await prepared(rig)
    await act.apply(merge(before.flags, CHANGE))
    await act.rollback(before)
    assert all(c.headers["authorization"] == f"Bearer {FORGE_TOKEN}" for c in rig.forge.calls)
    assert FORGE_TOKEN not in caplog.text
    assert all(FORGE_TOKEN not in e.message for e in rig.fleet.history())
    assert all(FORGE_TOKEN not in str(c.body) for c in rig.forge.calls)
    assert FORGE_TOKEN not in str(before.to_json())
    # a wrong token: refused with what to do, the token in neither the message nor the log
    assert rig.forge_token is not None
    rig.forge_token.write_text("ghp_wrong-token-that-must-not-show\n")
    act, before = await prepared(rig)
    with pytest.raises(ActuatorError) as refused:
        await act.apply(merge(before.flags, {"max-num-batched-tokens": 4096}))
    message = str(refused.value)
    assert "refused the token in" in message and "401 Bad credentials" in message
    assert "Contents and Pull requests" in message  # the scopes it needs
    for secret in ("ghp_wrong-token-that-must-not-show", FORGE_TOKEN):
        assert secret not in message and secret not in caplog.text
    assert rig.fleet.branches() == ["main"]  # the pushed branch was deleted again


async def test_a_token_in_the_repository_url_never_reaches_a_message(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    spec = rig.spec(repo_url="http://x-access-token:ghp_url-secret-0123@127.0.0.1:9/fleet.git")
    with pytest.raises(ActuatorError) as failed:
        await rig.actuator(spec).current()
    message = str(failed.value)
    assert "ghp_url-secret-0123" not in message and "ghp_url-secret-0123" not in caplog.text
    assert "git clone" in message and "127.0.0.1:9" in message  # what failed, and where
