"""Credentials never leave the bot in a URL it prints: ``redact`` removes the user info.

A target's ``vllm_url`` or ``prometheus_url`` may carry ``user:password@``; every text the bot
shows (probe errors in the Slack thread, the audit log, the incident page, the console) goes
through this one function where it names a URL, e.g. ``redact(f"cannot scrape {url}: {exc}")``.
"""

from __future__ import annotations

import re

# scheme://, then the user info: anything up to the last @ before the host's end (/ ? # or a
# space), so that an unencoded @ in a password goes too
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/?#\s<>|\"'`]*@")


def redact(text: str) -> str:
    """``text`` with the user info of every URL in it replaced by ``***``."""
    return _USERINFO.sub(r"\1***@", text)
