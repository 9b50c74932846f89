"""The bot's side of the agent: fetch one snapshot; every way it can fail is one AgentError.

The message of each AgentError is the sentence on-call reads in the thread: what happened
at which URL, and what to do about it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from bot.agent.reading import SCHEMA
from bot.kernel.runtime.redact import redact


class AgentError(Exception):
    """The agent could not give a snapshot; ``no_gpu`` when it answered that NVML is missing."""

    def __init__(self, message: str, *, no_gpu: bool = False) -> None:
        super().__init__(message)
        self.no_gpu = no_gpu


def read_token_file(path: Path | None) -> str | None:
    """The token in a (mounted Secret) file, read per call so a rotated token is picked up."""
    if path is None:
        return None
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise AgentError(
            f"cannot read gpu_agent_token_file {path}: {exc.strerror}; "
            "mount the agent's token Secret there"
        ) from None
    if not token:
        raise AgentError(f"gpu_agent_token_file {path} is empty: put the agent's token in it")
    return token


def _error_of(response: httpx.Response) -> tuple[str, str]:
    try:
        body = response.json()
        err = body["error"]
        return str(err.get("code", "")), str(err.get("message", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return "", response.text[:200]


async def fetch_snapshot(
    http: httpx.AsyncClient, base_url: str, *, token: str | None, max_processes: int,
    timeout_s: float,
) -> dict[str, Any]:  # fmt: skip
    """GET <agent>/snapshot; AgentError names the failure (401, down, timeout, no NVML)."""
    fetched = f"{base_url.rstrip('/')}/snapshot"
    url, base_url = redact(fetched), redact(base_url)  # what the messages name
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = await http.get(
            fetched, params={"max_processes": max_processes}, headers=headers, timeout=timeout_s
        )
    except httpx.TimeoutException:
        raise AgentError(
            f"the GPU agent at {base_url} did not answer within {timeout_s:g} s; "
            "check that its pod is running and not starved of CPU"
        ) from None
    except httpx.HTTPError as exc:
        raise AgentError(
            f"cannot reach the GPU agent at {base_url} ({redact(str(exc)) or type(exc).__name__}); "
            "check that `ruleloop agent` runs there and the port is open to the bot"
        ) from None
    if response.status_code == 401:
        why = "was sent no token" if token is None else "refused the bot's token"
        raise AgentError(
            f"the GPU agent at {base_url} {why} (HTTP 401); set gpu_agent_token_file to a file "
            "holding the agent's --token-file content"
        )
    code, message = _error_of(response)
    if response.status_code == 503 and code == "nvml_unavailable":
        raise AgentError(f"the GPU agent at {base_url} sees no GPU: {message}", no_gpu=True)
    if response.status_code != 200:
        raise AgentError(
            f"the GPU agent at {base_url} answered HTTP {response.status_code}: "
            f"{message or 'no reason given'}"
        )
    try:
        body: dict[str, Any] = response.json()
    except ValueError:
        raise AgentError(f"{url} answered 200 without JSON: is that a ruleloop agent?") from None
    if (
        not isinstance(body, dict)
        or body.get("schema") != SCHEMA
        or not isinstance(body.get("gpus"), list)
    ):
        raise AgentError(
            f"{url} did not answer a {SCHEMA} snapshot: is gpu_agent_url a ruleloop agent?"
        )
    return body
