"""Credentials for git and the forge: read from mounted files, kept out of every message.

A token is read from its file on every use (a rotated Secret takes effect without a restart)
and never stored in settings, argv, the clone's config, logs, the audit log, exceptions or
Slack. Whatever text ruleloop shows from git or the forge goes through ``scrub``: the user info
of any URL (``bot.kernel.runtime.redact``) and every known secret value are replaced by ``***``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from bot.change.gitops.errors import GitOpsError
from bot.kernel.runtime.redact import redact


def read_secret(path: Path, what: str) -> str:
    """The secret in ``path`` (stripped); GitOpsError naming the file, never its content."""
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise GitOpsError(
            f"cannot read the {what} from {path}: {exc.strerror}; mount the Secret there "
            "or fix the path in the settings"
        ) from None
    if not value:
        raise GitOpsError(f"the {what} file {path} is empty: put the token in the Secret")
    return value


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with URL credentials and each of ``secrets`` replaced by ``***``."""
    text = redact(text)
    for secret in secrets:
        if len(secret) >= 4:  # a one-letter "secret" would blank half the message
            text = text.replace(secret, "***")
    return text


def refuse_plain_http(url: str, what: str) -> None:
    """GitOpsError when ``url`` is plain http to a host other than this one: a token sent
    there crosses the network readable by anyone on the path."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "http" or _loopback(parts.hostname or ""):
        return
    raise GitOpsError(
        f"refusing to send the {what} over plain http to {parts.hostname}: use an https:// "
        "URL (plain http is allowed only to this host: localhost, 127.0.0.1, ::1)"
    )


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
