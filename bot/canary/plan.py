"""One request the canary sends: its prompt's token ids and its output length.

Made by bot/canary/shape_replay.py from a workload shape; sent by bot/canary/workload.py's
``Workload.body``. Its own module so that neither of those two imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """One request: its prompt as token ids (``prefix_tokens`` of them shared with others),
    its output length, and its declared group (index into the shape's groups; None: none)."""

    prompt_ids: list[int]
    output_tokens: int
    prefix_tokens: int = 0
    group: int | None = None

    @property
    def prompt_tokens(self) -> int:
        """The prompt's length in tokens."""
        return len(self.prompt_ids)
