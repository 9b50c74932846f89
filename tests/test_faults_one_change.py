"""Item 3 of the reliability faults: one change at a time per target.

Two `/apply-adr` on the same target, both approved, ran interleaved (apply 2, apply 3, ...,
rollback 2, rollback 3). Now at most one remediation per target is pending or running (a unique
partial index), and every other request is refused with a message that names the one in the way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import select

from bot.kernel.errors import UsageError
from bot.kernel.store.models import Remediation
from tests import store_reads
from tests.fakes.bot import Harness, harness
from tests.fakes.slack_api import FakeSlack
from tests.test_bot_store import postgres  # noqa: F401  (the real PostgreSQL server fixture)
from tests.test_remediation_slack import ADR, CARD_IS, answers, buttons, remediations
from tests.test_replicas import pg_url  # noqa: F401  (a fresh database on it)

pytestmark = pytest.mark.faults
REQUESTS = 10


@pytest.fixture
async def h(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[Harness]:
    harness_ = harness(tmp_path, slack=slack)
    yield harness_
    await harness_.close()


def incidents(h: Harness) -> int:
    with h.bot.db.transaction() as s:
        return len(store_reads.incidents(s))


def assert_names_the_first(
    text: str, rem: Remediation, *, racing: bool = False, doing: str = "waiting for approval"
) -> None:
    """The refusal names the change in the way: its id, ADR, state, requester and card (its
    link; while ``racing``, the winner's card may not be posted yet, and the refusal says so)."""
    assert text.startswith(f"{ADR} on prod-a was not requested: change #{rem.id} ({ADR}, "), text
    assert f"{rem.state}, requested by <@{rem.requested_by}>) is {doing} there" in text, text
    assert rem.channel is not None and rem.ts is not None
    link = f"<https://fake.slack.com/archives/{rem.channel}/p{rem.ts.replace('.', '')}|"
    posting = "its card is being posted in the incident's thread"
    assert link in text or (racing and posting in text), text
    assert text.endswith("Nothing was changed."), text


async def test_ten_concurrent_requests_on_one_target_make_one_change(
    h: Harness, slack: FakeSlack
) -> None:
    """Through the service: 10 requests at once; one card, nine refusals naming it."""
    results = await asyncio.gather(
        *(
            h.bot.remediation.request(
                user_id="U1", adr_id=ADR, target="prod-a", channel_id="C0INCIDENTS"
            )
            for _ in range(REQUESTS)
        ),
        return_exceptions=True,
    )
    accepted = [r for r in results if isinstance(r, str)]
    refused = [r for r in results if isinstance(r, UsageError)]
    assert (len(accepted), len(refused)) == (1, REQUESTS - 1), results
    (rem,) = remediations(h)
    for error in refused:
        assert_names_the_first(str(error), rem, racing=True)
    assert incidents(h) == 1  # the refused requests left no incident behind
    cards = [c for c in slack.of("chat.postMessage") if buttons(c)]
    assert len(cards) == 1
    # the one change runs; once it has ended the target takes the next request
    approve = buttons(cards[0])["remediation_approve"]
    await h.click(approve, user="U2", action_id="remediation_approve")
    await h.bot.tasks.drain()
    assert remediations(h)[0].state == "dry_run"
    again = await h.bot.remediation.request(user_id="U1", adr_id=ADR, target="prod-a")
    assert again.startswith(f"{ADR} on prod-a: the confirmation card is in the incident thread")
    assert [r.state for r in remediations(h)] == ["dry_run", "pending"]


async def test_ten_concurrent_signed_apply_adr_commands_make_one_change(
    h: Harness, slack: FakeSlack
) -> None:
    """The same through signed Slack slash commands: nine ephemeral refusals naming the one."""
    now = int(time.time())  # one timestamp each: the same signed request twice is a replay
    responses = await asyncio.gather(
        *(
            h.slash(f"{ADR} prod-a", command="/apply-adr", timestamp=now - n)
            for n in range(REQUESTS)
        )
    )
    assert all((r.status_code, r.text) == (200, "") for r in responses)  # acked at once
    refusals = await answers(slack, REQUESTS - 1)  # then each answered: one card, 9 refusals
    await h.bot.tasks.drain()
    acks = [c for c in slack.of("response_url") if c.args["text"].startswith(CARD_IS)]
    assert len(acks) == 1
    (rem,) = remediations(h)
    for text in refusals:
        assert_names_the_first(text, rem, racing=True)
    assert incidents(h) == 1


async def test_a_running_change_refuses_the_next_request_until_it_ends(
    h: Harness, slack: FakeSlack
) -> None:
    """Approved and running (not only pending) holds the target too."""
    await h.bot.remediation.request(user_id="U1", adr_id=ADR, target="prod-a")
    with h.bot.db.transaction() as s:
        rem = s.scalars(select(Remediation)).one()
        rem.state = "canary"  # as a run in its canary would have it
    with pytest.raises(UsageError) as refused:
        await h.bot.remediation.request(user_id="U1", adr_id=ADR, target="prod-a")
    assert_names_the_first(str(refused.value), remediations(h)[0], doing="running")
    assert len(remediations(h)) == 1
    with h.bot.db.transaction() as s:  # the run ends: its change is kept
        s.scalars(select(Remediation)).one().state = "promoted"
    again = await h.bot.remediation.request(user_id="U1", adr_id=ADR, target="prod-a")
    assert again.startswith(f"{ADR} on prod-a: the confirmation card is in the incident thread")
    assert [r.state for r in remediations(h)] == ["promoted", "pending"]


async def test_concurrent_requests_on_postgresql_from_two_bots_make_one_change(
    tmp_path: Path,
    pg_url: str,  # noqa: F811
    slack: FakeSlack,
) -> None:
    """Two bots (two engines, two connection pools) on one PostgreSQL database race 5 + 5."""
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
    bots = [harness(tmp_path / name, slack=slack, store={"url": pg_url}) for name in ("one", "two")]
    try:
        results = await asyncio.gather(
            *(
                bot.bot.remediation.request(
                    user_id="U1", adr_id=ADR, target="prod-a", channel_id="C0INCIDENTS"
                )
                for bot in bots
                for _ in range(REQUESTS // 2)
            ),
            return_exceptions=True,
        )
        accepted = [r for r in results if isinstance(r, str)]
        refused = [r for r in results if isinstance(r, UsageError)]
        assert (len(accepted), len(refused)) == (1, REQUESTS - 1), results
        (rem,) = remediations(bots[0])
        for error in refused:
            assert_names_the_first(str(error), rem, racing=True)
        assert incidents(bots[0]) == 1
    finally:
        for bot in bots:
            await bot.close()
