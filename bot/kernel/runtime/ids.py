"""Identifiers the bot mints: short error ids that tie a message to its log line, button tokens,
replica ids; and whether the process an id names still runs."""

from __future__ import annotations

import os
import secrets
import socket
import uuid


def new_error_id() -> str:
    """An 8-character id for one failure, shown to people and logged beside the traceback."""
    return uuid.uuid4().hex[:8]


def new_token() -> str:
    """An unguessable button value."""
    return secrets.token_urlsafe(24)


def replica_id() -> str:
    """This process as other replicas see it (lease owners, remediation runners): host:pid:random.

    The random part tells apart two runs in one process (a restarted scheduler, a second run)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (one we may not signal runs too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
