"""What the canary sends: the workload description and the prompts it builds.

Prompts have an exact token length. On `/v1/completions` they are sent as token ids, which the
OpenAI API accepts and vLLM counts exactly. Chat endpoints take text only, so chat prompts are
single-letter words; the runner measures how many tokens a word costs with vLLM's /tokenize
(byte-level: two, with the space; BPE: about one) so the length comes out close, and the report
shows the prompt tokens the engine actually counted.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from bot.adr.workload import WorkloadShape

if TYPE_CHECKING:
    from bot.canary.plan import Plan

# Token ids drawn for prompts: low enough to exist in every vocabulary, above the special ids
# that some tokenizers keep at the very bottom.
PROMPT_ID_RANGE = (100, 250)


class Api(StrEnum):
    """The OpenAI-compatible API an endpoint speaks, from its path."""

    COMPLETIONS = "completions"
    CHAT = "chat"


class CancelMode(StrEnum):
    """How impatient clients give up: close the stream, or ask the gateway for a deadline."""

    ABANDON = "abandon"
    HEADER = "header"


@dataclass(frozen=True)
class Workload:
    """One canary run: where to send, what, how much and how fast."""

    endpoint: str
    model: str | None = None
    concurrency: int = 10
    request_rate: float | None = None  # requests/s (Poisson); None means fixed concurrency
    num_requests: int | None = 100
    duration_s: float | None = None
    # Pulse: a base load of pulse_base_share x concurrency streams, bursting to all of them for
    # pulse_width_s every pulse_period_s (None: steady load). See docs/canary.md.
    pulse_period_s: float | None = None
    pulse_width_s: float = 10.0
    pulse_base_share: float = 0.25
    prompt_length: int = 128
    prefix_length: int = 0
    output_length: int = 64
    ignore_eos: bool = True
    cancel_share: float = 0.0
    cancel_after_ms: float = 500.0
    # Impatient clients give up after this many received tokens instead of after
    # cancel_after_ms: a condition that holds on any machine, however fast it generates.
    cancel_after_tokens: int | None = None
    cancel_mode: CancelMode = CancelMode.ABANDON
    warmup_requests: int = 0
    seed: int = 0
    timeout_s: float = 600.0
    # Replay this workload shape (bot/canary/shape_replay.py): lengths, prefixes and arrivals
    # come from it, and prompt_length, prefix_length, output_length and request_rate are
    # unused; concurrency is the in-flight cap.
    shape: WorkloadShape | None = None

    @property
    def api(self) -> Api:
        """Chat when the endpoint path ends in chat/completions, else completions."""
        return (
            Api.CHAT
            if urlsplit(self.endpoint).path.rstrip("/").endswith("chat/completions")
            else Api.COMPLETIONS
        )

    def base_streams(self) -> int:
        """Streams that send all the time; the rest send only during bursts (pulse)."""
        if self.pulse_period_s is None:
            return self.concurrency
        return max(1, round(self.concurrency * self.pulse_base_share))

    def in_burst(self, elapsed_s: float) -> bool:
        """Whether a pulse's burst is on ``elapsed_s`` seconds into the run."""
        if self.pulse_period_s is None:
            return True
        return elapsed_s % self.pulse_period_s < self.pulse_width_s

    def next_burst_in(self, elapsed_s: float) -> float:
        """Seconds until the next burst starts (0 during a burst)."""
        if self.in_burst(elapsed_s) or self.pulse_period_s is None:
            return 0.0
        return self.pulse_period_s - elapsed_s % self.pulse_period_s

    @property
    def base_url(self) -> str:
        """Scheme and host of the endpoint, e.g. http://127.0.0.1:8000."""
        parts = urlsplit(self.endpoint)
        return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def check(workload: Workload) -> list[str]:
    """Everything wrong with a workload, as messages that say what to change (empty if fine)."""
    problems = [
        *_endpoint_problems(workload),
        *_amount_problems(workload),
        *_shape_problems(workload),
        *_pulse_problems(workload),
        *_length_problems(workload),
        *_cancel_problems(workload),
        *_token_cancel_problems(workload),
    ]
    if workload.warmup_requests < 0:
        problems.append(f"--warmup must be 0 or more (got {workload.warmup_requests})")
    return problems


def _endpoint_problems(workload: Workload) -> list[str]:
    """What is wrong with --endpoint: an http(s) URL of one of the two completion APIs."""
    parts = urlsplit(workload.endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return [
            f"--endpoint {workload.endpoint!r} is not an http(s) URL; "
            "use e.g. http://127.0.0.1:8000/v1/completions"
        ]
    if not parts.path.rstrip("/").endswith("completions"):
        return [
            f"--endpoint {workload.endpoint!r} must end in /v1/completions or /v1/chat/completions"
        ]
    return []


def _amount_problems(workload: Workload) -> list[str]:
    """What is wrong with how much the run sends: streams, rate, requests and duration."""
    problems = []
    if workload.concurrency < 1:
        problems.append(f"--concurrency must be at least 1 (got {workload.concurrency})")
    if workload.request_rate is not None and workload.request_rate <= 0:
        problems.append(f"--request-rate must be above 0 requests/s (got {workload.request_rate})")
    if workload.num_requests is None and workload.duration_s is None:
        problems.append("give --num-requests or --duration")
    if workload.num_requests is not None and workload.num_requests < 1:
        problems.append(f"--num-requests must be at least 1 (got {workload.num_requests})")
    if workload.duration_s is not None and workload.duration_s <= 0:
        problems.append(f"--duration must be above 0 seconds (got {workload.duration_s})")
    return problems


def _shape_problems(workload: Workload) -> list[str]:
    """The options a replayed --workload shape contradicts (it brings its own arrivals)."""
    if workload.shape is None:
        return []
    problems = []
    if workload.request_rate is not None:
        problems.append("--request-rate contradicts --workload (the shape's arrivals)")
    if workload.pulse_period_s is not None:
        problems.append("--pulse contradicts --workload (the shape's arrivals)")
    if not workload.ignore_eos:
        problems.append(
            "--no-ignore-eos contradicts --workload: the shape's output lengths are sent "
            "as max_tokens with ignore_eos"
        )
    return problems


def _pulse_problems(workload: Workload) -> list[str]:
    """What is wrong with --pulse and its period, width and base share."""
    if workload.pulse_period_s is None:
        return []
    problems = []
    if workload.request_rate is not None:
        problems.append("--pulse shapes fixed-concurrency load; drop --request-rate")
    if workload.pulse_period_s <= 0 or workload.pulse_width_s <= 0:
        problems.append("--pulse-period and --pulse-width must be above 0 seconds")
    elif workload.pulse_width_s >= workload.pulse_period_s:
        problems.append(
            f"--pulse-width ({workload.pulse_width_s:g} s) must be shorter than "
            f"--pulse-period ({workload.pulse_period_s:g} s)"
        )
    if not 0.0 <= workload.pulse_base_share < 1.0:
        problems.append(
            f"--pulse-base must be at least 0 and below 1 (got {workload.pulse_base_share})"
        )
    return problems


def _length_problems(workload: Workload) -> list[str]:
    """What is wrong with the prompt, prefix and output lengths."""
    problems = []
    if workload.prompt_length < 1:
        problems.append(f"--prompt-length must be at least 1 token (got {workload.prompt_length})")
    if not 0 <= workload.prefix_length < max(workload.prompt_length, 1):
        problems.append(
            f"--prefix-length must be between 0 and --prompt-length - 1 "
            f"(got {workload.prefix_length} with --prompt-length {workload.prompt_length})"
        )
    if workload.output_length < 1:
        problems.append(f"--output-length must be at least 1 token (got {workload.output_length})")
    return problems


def _cancel_problems(workload: Workload) -> list[str]:
    """What is wrong with the share of impatient clients and when they give up."""
    problems = []
    if not 0.0 <= workload.cancel_share <= 1.0:
        problems.append(f"--cancel-share must be between 0 and 1 (got {workload.cancel_share})")
    if workload.cancel_after_ms <= 0:
        problems.append(f"--cancel-after-ms must be above 0 (got {workload.cancel_after_ms})")
    return problems


def _token_cancel_problems(workload: Workload) -> list[str]:
    """What is wrong with --cancel-after-tokens in this workload."""
    n = workload.cancel_after_tokens
    if n is None:
        return []
    if n < 1:
        return [f"--cancel-after-tokens must be at least 1 (got {n})"]
    problems = []
    if n >= workload.output_length:
        # The answer would be complete before the client gives up: nobody would cancel.
        problems.append(
            f"--cancel-after-tokens must be below --output-length "
            f"(got {n} with --output-length {workload.output_length})"
        )
    if workload.cancel_share <= 0:
        problems.append("--cancel-after-tokens needs --cancel-share above 0")
    if workload.cancel_mode is CancelMode.HEADER:
        # X-Request-Timeout carries a deadline in time; a gateway cannot count tokens for us.
        problems.append(
            "--cancel-after-tokens works with --cancel-mode abandon only "
            "(the header carries a time: use --cancel-after-ms)"
        )
    return problems


class PromptFactory:
    """Builds distinct prompts of an exact length that share a common prefix. ``salt`` makes
    the tokens a run's own (the lengths stay those of the workload)."""

    def __init__(self, workload: Workload, *, salt: str = "") -> None:
        self._rng = random.Random(f"{workload.seed}:{salt}")
        self._workload = workload
        self._ids = range(*PROMPT_ID_RANGE)
        self._prefix_ids = self._rng.choices(self._ids, k=workload.prefix_length)
        self.tokens_per_word = 1.0
        self._prefix_text: list[str] | None = None

    def token_ids(self) -> list[int]:
        """A prompt as token ids: the shared prefix, then a random unique suffix."""
        n = self._workload.prompt_length - self._workload.prefix_length
        return self._prefix_ids + self._rng.choices(self._ids, k=n)

    def text(self) -> str:
        """A prompt as text: single-letter words, as many as the token length needs."""
        w = self._workload
        if self._prefix_text is None:
            self._prefix_text = self._words(w.prefix_length)
        return " ".join(self._prefix_text + self._words(w.prompt_length - w.prefix_length))

    def _words(self, tokens: int) -> list[str]:
        count = round(tokens / self.tokens_per_word) if tokens else 0
        return [self._rng.choice(string.ascii_lowercase) for _ in range(count)]

    def plan_text(self, plan: Plan) -> str:
        """A planned prompt as text: one single-letter word per token id (as many as its length
        needs), its shared prefix turned into the same words in every request."""
        shared = plan.prompt_ids[: plan.prefix_tokens]
        rest = plan.prompt_ids[plan.prefix_tokens :]
        return " ".join(self._letters(shared) + self._letters(rest))

    def _letters(self, ids: list[int]) -> list[str]:
        count = min(round(len(ids) / self.tokens_per_word), len(ids)) if ids else 0
        return [string.ascii_lowercase[i % 26] for i in ids[:count]]

    def body(self, model: str, plan: Plan | None = None) -> dict[str, object]:
        """The JSON body of one streaming request: the fixed workload's, or ``plan``'s."""
        w = self._workload
        body: dict[str, object] = {
            "model": model,
            "max_tokens": w.output_length if plan is None else plan.output_tokens,
            "stream": True,
            # Usage once, at the end, as production clients ask: vLLM's continuous_usage_stats
            # builds it for every chunk on the engine's cores (docs/canary.md). Tokens are
            # counted per chunk while the stream runs (bot/canary/client.py).
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
        }
        if w.ignore_eos:
            body["ignore_eos"] = True
        if w.api is Api.CHAT:
            text = self.text() if plan is None else self.plan_text(plan)
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = self.token_ids() if plan is None else plan.prompt_ids
        return body
