"""What an inference request will cost in tokens, read from its JSON body before admission.

cost = prompt tokens + max(n, best_of) * max_tokens, where prompt tokens are
  - exact when the prompt is token ids (``"prompt": [1, 2, 3]`` or a list of such lists),
  - counted by the configured tokenizer for text, when one is configured (``--tokenizer``),
  - else estimated as ceil(UTF-8 bytes / 4) per text, plus 4 per chat message for the template;
and max_tokens is the larger of ``max_tokens`` and ``max_completion_tokens`` (vLLM obeys
``max_completion_tokens`` when both are sent: counting only ``max_tokens`` let 300 tokens in at
a cost of 1), else the gateway's ``default_max_tokens``.

A chat template renders more than message content: everything else in a message (``tool_calls``
and their arguments, ``name``, reasoning…) and the request's ``tools``, ``functions``,
``documents`` and ``chat_template_kwargs`` are counted as their JSON text, so a prompt carried
there costs what it would in ``content``. What cannot be counted from the body is refused: a
request's own ``chat_template`` (a loop in it renders any length) and ``prompt_embeds``.
A body that cannot be costed is a 400 and is never admitted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bot.gateway.responses import HTTPProblem

BYTES_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4

# Request fields a chat template renders into the prompt besides the messages.
RENDERED_CHAT_FIELDS = ("tools", "functions", "documents", "chat_template_kwargs")
# Fields whose token count the body does not tell.
UNCOSTABLE_FIELDS = ("chat_template", "prompt_embeds")

TokenCounter = Callable[[str], int]


@dataclass(frozen=True, slots=True)
class Cost:
    """A request's token cost and the facts about it the gateway keeps."""

    prompt_tokens: int
    max_output_tokens: int
    stream: bool

    @property
    def total(self) -> int:
        """Tokens the request may hold in the engine at most."""
        return self.prompt_tokens + self.max_output_tokens


def bad_request(message: str, param: str | None = None) -> HTTPProblem:
    """400 invalid_request_error about one field."""
    return HTTPProblem(400, message, param=param, code="invalid_request")


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; 400 when it is not one."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON ({exc})") from None
    except RecursionError:  # e.g. 30,000 nested arrays: the parser's stack runs out
        raise bad_request("request body is not usable JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    return body


class Costing:
    """Estimates request costs; the tokenizer (text -> token count) is optional and injected."""

    def __init__(self, *, count_tokens: TokenCounter | None = None) -> None:
        self._count = count_tokens

    def estimate(self, body: dict[str, Any], *, chat: bool, default_max_tokens: int) -> Cost:
        """The cost of one completions or chat request body; 400 when the body is unusable."""
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise bad_request("'model' is required and must be a non-empty string", "model")
        for field in UNCOSTABLE_FIELDS:
            if body.get(field) is not None:
                raise bad_request(f"the gateway cannot cost '{field}': send it without", field)
        prompt = self._chat_request_tokens(body) if chat else self._prompt_tokens(body)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise bad_request("'stream' must be true or false", "stream")
        output = _output_tokens(body, default_max_tokens)
        return Cost(prompt_tokens=prompt, max_output_tokens=output, stream=stream)

    def _text(self, text: str) -> int:
        if self._count is not None:
            return self._count(text)
        return math.ceil(len(text.encode()) / BYTES_PER_TOKEN)

    def _prompt_tokens(self, body: dict[str, Any]) -> int:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return self._text(prompt)
        if isinstance(prompt, list) and prompt:
            if all(_is_token(t) for t in prompt):
                return len(prompt)
            if all(isinstance(p, str) for p in prompt):
                return sum(self._text(p) for p in prompt)
            if all(isinstance(p, list) and p and all(_is_token(t) for t in p) for p in prompt):
                return sum(len(p) for p in prompt)
        raise bad_request(
            "'prompt' is required: a string, a list of strings, a list of token ids, "
            "or a list of token-id lists",
            "prompt",
        )

    def _chat_request_tokens(self, body: dict[str, Any]) -> int:
        """The messages and every other field the template renders."""
        total = self._chat_tokens(body.get("messages"))
        for field in RENDERED_CHAT_FIELDS:
            if body.get(field) is not None:
                total += self._json_tokens(body[field])
        return total

    def _chat_tokens(self, messages: object) -> int:
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' is required and must be a non-empty list", "messages")
        total = 0
        for message in messages:
            if not isinstance(message, dict):
                raise bad_request("each message must be an object", "messages")
            total += CHAT_TOKENS_PER_MESSAGE + self._content_tokens(message.get("content"))
            # tool_calls (their arguments), name, reasoning…: the template renders them too.
            rest = {k: v for k, v in message.items() if k not in ("role", "content")}
            if rest:
                total += self._json_tokens(rest)
        return total

    def _content_tokens(self, content: object) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self._text(content)
        if isinstance(content, list):
            return sum(self._part_tokens(part) for part in content)
        raise bad_request("message 'content' must be a string or a list of parts", "messages")

    def _part_tokens(self, part: object) -> int:
        """A text part's text; any other part as its JSON (a lower bound for media)."""
        if isinstance(part, dict) and set(part) <= {"type", "text"}:
            text = part.get("text")
            if isinstance(text, str):
                return self._text(text)
        return self._json_tokens(part)

    def _json_tokens(self, value: object) -> int:
        """A JSON value as the text a template would print of it."""
        return self._text(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _output_tokens(body: dict[str, Any], default_max_tokens: int) -> int:
    """The most tokens the engine may generate: every sequence at the larger of the limits."""
    limits = [_positive_int(body, k) for k in ("max_tokens", "max_completion_tokens")]
    given = [v for v in limits if v is not None]
    sequences = max(_positive_int(body, "n") or 1, _positive_int(body, "best_of") or 1)
    return sequences * (max(given) if given else default_max_tokens)


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_request(f"'{key}' must be a positive integer", key)
    return value


def tokenizer_counter(path: str) -> TokenCounter:
    """A token counter from a Hugging Face tokenizer.json (needs the `tokenizers` package)."""
    from tokenizers import Tokenizer  # optional: only when --tokenizer is given

    tokenizer = Tokenizer.from_file(path)
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)
