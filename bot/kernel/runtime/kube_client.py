"""A client of the Kubernetes API, as every part of the bot that reads it needs one.

A bearer token read from its file on every request (the kubelet rotates projected
service-account tokens in place, so a token read once would expire after about an hour) and the
cluster's CA. Used by the actuators (a Deployment's flags and rollout) and by fleet discovery (a
Service's EndpointSlices); each says its failures in its own error type.
"""

from __future__ import annotations

import ssl
from collections.abc import Generator
from pathlib import Path

import httpx


class TokenFile(httpx.Auth):
    """Bearer auth from a service-account token file, read on every request."""

    def __init__(self, path: Path, *, error: type[Exception]) -> None:
        self.path = path
        self.error = error

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        try:
            token = self.path.read_text().strip()
        except OSError as exc:
            raise self.error(
                f"cannot read the Kubernetes service-account token {self.path}: {exc.strerror}"
            ) from exc
        request.headers["Authorization"] = f"Bearer {token}"
        yield request


def client(
    api_url: str,
    *,
    token_file: Path | None,
    ca_file: Path | None,
    error: type[Exception],
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """An API client: the bearer token from token_file (none when unset, e.g. behind
    ``kubectl proxy``), the cluster CA from ca_file when it exists. A token or CA that cannot
    be read raises ``error``."""
    verify: ssl.SSLContext | bool = True
    if ca_file is not None and ca_file.exists():
        try:
            verify = ssl.create_default_context(cafile=str(ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise error(f"cannot load the cluster CA from {ca_file}: {exc}") from exc
    return httpx.AsyncClient(
        base_url=api_url,
        auth=TokenFile(token_file, error=error) if token_file is not None else None,
        verify=verify,
        transport=transport,
        timeout=httpx.Timeout(30.0),
    )


def status_message(response: httpx.Response) -> str:
    """The ``message`` of a ``kind: Status`` error body, else the start of the body."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    text = response.text.strip()
    return text[:200] if text else response.reason_phrase
