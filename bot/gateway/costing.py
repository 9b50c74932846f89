"""What an inference request will cost in tokens, read from its JSON body before admission.

cost = prompt tokens + n * max_tokens, where prompt tokens are
  - exact when the prompt is token ids (``"prompt": [1, 2, 3]`` or a list of such lists),
  - counted by the configured tokenizer for text, when one is configured (``--tokenizer``),
  - else estimated as ceil(UTF-8 bytes / 4) per text, plus 4 per chat message for the template;
and max_tokens is ``max_tokens`` or ``max_completion_tokens``, else the gateway's
``default_max_tokens``. A body that cannot be costed is a 400 and is never admitted.
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
        prompt = self._chat_tokens(body.get("messages")) if chat else self._prompt_tokens(body)
        max_tokens = _positive_int(body, "max_tokens")
        if max_tokens is None:
            max_tokens = _positive_int(body, "max_completion_tokens")
        n = _positive_int(body, "n") or 1
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise bad_request("'stream' must be true or false", "stream")
        output = n * (default_max_tokens if max_tokens is None else max_tokens)
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

    def _chat_tokens(self, messages: object) -> int:
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' is required and must be a non-empty list", "messages")
        total = 0
        for message in messages:
            if not isinstance(message, dict):
                raise bad_request("each message must be an object", "messages")
            total += CHAT_TOKENS_PER_MESSAGE + self._content_tokens(message.get("content"))
        return total

    def _content_tokens(self, content: object) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self._text(content)
        if isinstance(content, list):
            parts = [p.get("text") for p in content if isinstance(p, dict)]
            return sum(self._text(t) for t in parts if isinstance(t, str))
        raise bad_request("message 'content' must be a string or a list of parts", "messages")


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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
