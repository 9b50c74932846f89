"""A thread message as a terminal line (the demo prints the re-tune's end so)."""

from __future__ import annotations

import pytest

from bot.kernel.chat import escape, readable


@pytest.mark.parametrize(
    ("mrkdwn", "text"),
    [
        (":x: *its one trial did not meet the gates*", "its one trial did not meet the gates"),
        (
            ":white_check_mark: drafted `--max-num-seqs=4` for the live workload",
            "drafted --max-num-seqs=4 for the live workload",
        ),
        ("restored at 12:30:45 :+1:", "restored at 12:30:45 "),  # a time is not an emoji code
        ("max_num_batched_tokens stays", "max_num_batched_tokens stays"),  # underscores are words
        (escape("p99 < 0.5x before & held"), "p99 < 0.5x before & held"),
    ],
)
def test_readable_drops_the_marks_and_keeps_the_words(mrkdwn: str, text: str) -> None:
    assert readable(mrkdwn) == text
