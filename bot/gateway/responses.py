"""What the gateway says when it answers for itself: OpenAI-shaped errors, as JSON or as SSE.

Every refusal is an ``HTTPProblem`` raised where it is found and rendered here, so the texts
clients read live together. Body shape (as OpenAI's API):
``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``.
"""

from __future__ import annotations

import json

JSON_HEADERS = [(b"content-type", b"application/json")]


class HTTPProblem(Exception):
    """A request the gateway answers itself with an OpenAI-shaped error."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002 - the OpenAI field's name
        param: str | None = None,
        code: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or []

    def body(self) -> bytes:
        """The JSON error body."""
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(
    message: str,
    *,
    type: str,
    param: str | None = None,
    code: str | None = None,  # noqa: A002
) -> bytes:
    """An OpenAI-shaped JSON error body."""
    error = {"message": message, "type": type, "param": param, "code": code}
    return json.dumps({"error": error}).encode()


def sse_error(message: str, *, type: str, code: str) -> bytes:  # noqa: A002
    """A final SSE error event followed by the end-of-stream marker, as vLLM ends failed streams."""
    return b"data: " + error_body(message, type=type, code=code) + b"\n\ndata: [DONE]\n\n"


# Texts, together so they can be read and improved as prose.
def budget_spent(cost: int, in_flight: int, limit: int, retry_after_s: int) -> HTTPProblem:
    """429: the in-flight token budget cannot take this request now."""
    return HTTPProblem(
        429,
        f"the gateway's in-flight token budget is spent ({in_flight} of {limit} tokens in flight; "
        f"this request needs about {cost}); retry after {retry_after_s} s",
        type="rate_limit_error",
        code="rate_limit_exceeded",
        headers=[(b"retry-after", str(retry_after_s).encode())],
    )


def over_whole_budget(cost: int, limit: int) -> HTTPProblem:
    """413: the request alone needs more than the whole budget, so retrying cannot help."""
    return HTTPProblem(
        413,
        f"this request needs about {cost} tokens (prompt + max_tokens), more than the gateway's "
        f"whole in-flight budget of {limit}; lower max_tokens or shorten the prompt",
        param="max_tokens",
        code="exceeds_budget",
    )


def timeout_header_required() -> HTTPProblem:
    """400: the limits require every request to say its deadline."""
    return HTTPProblem(
        400,
        "X-Request-Timeout is required by this gateway: send e.g. 'X-Request-Timeout: 30s' "
        "or '500ms' (a plain number is seconds)",
        param="X-Request-Timeout",
        code="invalid_request",
    )


def body_too_large(limit: int) -> HTTPProblem:
    """413: the body is larger than the gateway accepts."""
    return HTTPProblem(
        413,
        f"request body is larger than the gateway's limit of {limit} bytes",
        code="request_too_large",
    )


def deadline_before_output(timeout_s: float) -> HTTPProblem:
    """504: the deadline passed before the engine sent anything."""
    return HTTPProblem(
        504,
        f"the request's deadline of {timeout_s:g} s passed before the engine answered; "
        "the gateway aborted it (raise X-Request-Timeout or retry when the engine is less busy)",
        type="timeout_error",
        code="deadline_exceeded",
    )


def deadline_mid_stream(timeout_s: float) -> bytes:
    """The SSE event that ends a stream whose deadline passed."""
    return sse_error(
        f"the request's deadline of {timeout_s:g} s passed mid-stream; the gateway aborted it",
        type="timeout_error",
        code="deadline_exceeded",
    )


def upstream_unreachable(detail: str) -> HTTPProblem:
    """502: the engine could not be reached or broke the connection before answering."""
    return HTTPProblem(
        502,
        f"the gateway could not reach the inference engine ({detail})",
        type="upstream_error",
        code="bad_gateway",
    )


def upstream_broke_mid_stream(detail: str) -> bytes:
    """The SSE event that ends a stream whose upstream connection failed."""
    return sse_error(
        f"the inference engine's stream broke ({detail})", type="upstream_error", code="bad_gateway"
    )


def ambiguous_path(target: str) -> HTTPProblem:
    """400: a request target that may name another path to the engine than to the gateway."""
    shown = target if len(target) <= 200 else target[:200] + "..."
    return HTTPProblem(
        400,
        f"request target {shown!r} is refused: the gateway takes a plain absolute path only "
        "(no '.' or '..' segments, no '//', no backslash, no percent-encoding), so that it "
        "routes on the path the engine will see",
        code="ambiguous_path",
    )


def no_such_path(path: str, known: list[str]) -> HTTPProblem:
    """404: a path the gateway neither serves nor forwards."""
    shown = path if len(path) <= 200 else path[:200] + "..."
    return HTTPProblem(
        404,
        f"the gateway has no route {shown}; it serves and forwards only {', '.join(known)}, "
        "/admin/limits and /admin/requests",
        code="not_found",
    )


def wrong_method(path: str, methods: tuple[str, ...]) -> HTTPProblem:
    """405: a known path asked with a method it does not take."""
    allow = ", ".join(methods)
    return HTTPProblem(
        405,
        f"{path} takes {allow}",
        code="method_not_allowed",
        headers=[(b"allow", allow.encode())],
    )
