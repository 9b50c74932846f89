"""Causes in the incident thread (issue 33), with the real bot (create_bot, the slack-bolt app,
the SQLite store) and Slack faked at the wire; the engine's /metrics are recorded pages whose
TTFT p99 is far over 1 ms, and the test runbook's one hypothesis reads it:

- an ADR that answers the supported cause is offered; one whose cause is ruled out is not, and
  the findings say why in one line;
- two incidents of the same cause on one target: the second thread names the first and the ADR
  applied then (kept), and how the workload moved since;
- "Cause confirmed" / "Wrong cause": refused to a user without access (nothing kept, nothing
  audited), kept and audited once for one with it; a cause marked wrong is said so the next time.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import select

from bot.incidents import memory
from bot.kernel.chat.mrkdwn import unescape
from bot.kernel.store import service as store
from bot.kernel.store.models import CauseFeedback, Remediation
from tests import store_reads
from tests.fakes.alerts import alert, body
from tests.fakes.bot import RUNBOOK, Harness, adr_dir, harness
from tests.fakes.slack_api import FakeSlack
from tests.test_remediation_slack import buttons

SEED = "ADR-20260831-01"  # cause: kv_cache_pressure
MOVED = "prompt p50: 2,000–5,000 -> 500–1,000 tokens (more than 2x smaller): DRIFTED"


def runbook(supported_when: str) -> str:
    """The test runbook with one hypothesis on kv_cache_pressure."""
    return RUNBOOK + (
        "hypotheses:\n"
        "  - cause: kv_cache_pressure\n"
        f"    supported_when: {supported_when}\n"
        '    number: "TTFT p99 {vllm_metrics.ttft_p99_ms}"\n'
        '    evidence: "TTFT p99 {vllm_metrics.ttft_p99_ms}"\n'
    )


async def bot(tmp_path: Path, slack: FakeSlack, supported_when: str) -> Harness:
    runbooks = tmp_path / "cause-runbooks"
    runbooks.mkdir()
    (runbooks / "test.yaml").write_text(runbook(supported_when))
    paths = {"runbooks": str(runbooks), "adr": str(adr_dir(tmp_path, matching=True))}
    return harness(tmp_path, slack=slack, matching_adr=True, paths=paths)


def firing(n: int, status: str = "firing") -> bytes:
    """Alert ``n`` on prod-a (each its own instance: its own startsAt)."""
    starts = f"2026-09-0{n}T02:13:07.861Z"
    return body(alert(ruleloop_target="prod-a", status=status, starts_at=starts))


async def incident(h: Harness, n: int) -> None:
    """A new incident on prod-a, diagnosed (the one before it resolved first)."""
    if n > 1:
        answer = await h.webhook(firing(n - 1, "resolved"))
        assert answer.json()["outcome"] == "resolved", answer.text
    answer = await h.webhook(firing(n))
    assert answer.json()["outcome"] == "opened", answer.text
    await h.bot.tasks.drain()


def thread(slack: FakeSlack) -> list[str]:
    """Every thread message posted, text and blocks, unescaped."""
    return [unescape(json.dumps(c.args, ensure_ascii=False)) for c in slack.of("chat.postMessage")
            if c.args.get("thread_ts")]  # fmt: skip


def feedback_buttons(slack: FakeSlack) -> dict[str, str]:
    found = [buttons(c) for c in slack.of("chat.postMessage") if c.args.get("blocks")]
    return [b for b in found if "incident_cause_wrong" in b][-1]


@pytest.fixture
async def supported(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[Harness]:
    h = await bot(tmp_path, slack, "vllm_metrics.ttft_p99_ms > 1")
    try:
        yield h
    finally:
        await h.close()


async def test_an_adr_whose_cause_is_ruled_out_is_not_offered_and_the_thread_says_why(
    tmp_path: Path, slack: FakeSlack
) -> None:
    h = await bot(tmp_path, slack, "vllm_metrics.ttft_p99_ms < 1")
    try:
        await incident(h, 1)
    finally:
        await h.close()
    text = "\n".join(thread(slack))
    assert f"{SEED} answers kv_cache_pressure, ruled out: TTFT p99" in text
    with h.bot.db.transaction() as s:
        [kept] = store_reads.incidents(s)
        assert kept.summary.matches == []  # not offered
    assert not any(f"Matching accepted ADRs: {SEED}" in t for t in thread(slack))


async def test_an_adr_whose_cause_is_supported_is_offered(
    supported: Harness, slack: FakeSlack
) -> None:
    await incident(supported, 1)
    with supported.bot.db.transaction() as s:
        [kept] = store_reads.incidents(s)
        assert kept.summary.matches == [SEED]
    assert "answers kv_cache_pressure," not in "\n".join(thread(slack))  # no refusal line
    assert any(f"Matching accepted ADRs: {SEED}" in t for t in thread(slack))  # with its Apply
    assert any("_(answers kv_cache_pressure)_" in t for t in thread(slack))


async def test_the_second_incident_of_a_cause_names_the_first_and_its_kept_adr(
    supported: Harness, slack: FakeSlack
) -> None:
    await incident(supported, 1)
    assert not any(":repeat:" in t for t in thread(slack))  # the first time: nothing to recall
    now = supported.wall.now()
    with supported.bot.db.transaction() as s:  # the fix was applied and kept; the drift job ran
        s.add(Remediation(incident_id=1, adr_id=SEED, target="prod-a", requested_by="U1",
                          state="promoted", approvals_needed=1, approved_by=["U2"],
                          created_at=now, updated_at=now))  # fmt: skip
        drift = store.create(s, key="drift:prod-a", source="workload_drift", title="drift",
                             target="prod-a", labels={}, at=now)  # fmt: skip
        store.audit(s, at=now, actor="ruleloop", action="workload.drift", incident=drift,
                    detail={"dimensions": {SEED: [MOVED]}})  # fmt: skip
    before = len(thread(slack))
    await incident(supported, 2)
    [line] = [t for t in thread(slack)[before:] if ":repeat:" in t]
    assert "2nd time in 7 days: *kv_cache_pressure*" in line
    assert f"(incident #1) {SEED} was applied and kept" in line
    assert f"since then the workload moved: {MOVED}" in line


async def test_cause_buttons_refuse_without_access_and_keep_an_answer_once(
    supported: Harness, slack: FakeSlack
) -> None:
    await incident(supported, 1)
    pair = feedback_buttons(slack)
    assert set(pair) >= {"incident_cause_confirmed", "incident_cause_wrong"}
    answers = slack.of("response_url")

    async def press(action_id: str, user: str) -> None:
        reply = await supported.click(pair[action_id], user=user, action_id=action_id)
        assert reply.status_code == 200, reply.text
        await supported.bot.tasks.drain()

    await press("incident_cause_wrong", "U9")
    assert any(
        "You may not judge the cause of incidents" in str(a.args) for a in slack.of("response_url")
    )

    def kept() -> tuple[list[tuple[str, str, str]], list[tuple[str, str]]]:
        with supported.bot.db.transaction() as s:
            rows = [(f.cause, f.verdict, f.actor) for f in s.scalars(select(CauseFeedback))]
            trail = [(e.actor, e.action) for e in store_reads.audit_trail(s)
                     if e.action.startswith("cause.")]  # fmt: skip
        return rows, trail

    assert kept() == ([], [])
    await press("incident_cause_wrong", "U1")
    assert kept() == ([("kv_cache_pressure", "wrong", "U1")], [("U1", "cause.wrong")])
    assert any("<@U1> marked the cause wrong: *kv_cache_pressure*" in t for t in thread(slack))
    await press("incident_cause_confirmed", "U1")  # the pair is spent: nothing more is kept
    assert len(kept()[0]) == 1 and len(slack.of("response_url")) > len(answers)
    before = len(thread(slack))
    await incident(supported, 2)
    said = "\n".join(thread(slack)[before:])
    with supported.bot.db.transaction() as s:
        at = s.scalars(select(CauseFeedback.at)).one()
    assert f"on-call marked this cause wrong on {memory.day(at)}" in said, said
