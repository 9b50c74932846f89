"""Plumbing every layer may use; nothing here knows about incidents, runbooks or Slack.

tasks.py     ``TaskSupervisor``: background tasks kept until done, failures logged by id
metrics.py   the bot's own Prometheus metrics (``BotMetrics``)
ids.py       error ids, button tokens, this replica's id
access.py    access lists (Slack users and user groups): who may, named for people
sse.py       server-sent events by the spec (LF, CRLF, CR), shared by the canary and the gateway
loop.py      a coroutine run on uvloop where it is installed, else on asyncio's loop
heads.py     request heads with a ceiling and a deadline, for every uvicorn server we run
redact.py    the user info removed from a URL before it is printed
kube_client.py  a client of the Kubernetes API, for every part that reads it
defaults.py  the runbooks and seed ADR shipped inside the package
logs.py      the log: text or JSON lines, each with the incident and change it is about
tracing.py   OpenTelemetry traces of an alert's and a change's path (off without a collector)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.kernel.runtime.access import Members as Members
    from bot.kernel.runtime.access import is_group as is_group
    from bot.kernel.runtime.access import who_may as who_may
    from bot.kernel.runtime.defaults import with_defaults as with_defaults
    from bot.kernel.runtime.heads import GuardedHttpToolsProtocol as GuardedHttpToolsProtocol
    from bot.kernel.runtime.heads import HeadLimits as HeadLimits
    from bot.kernel.runtime.ids import new_error_id as new_error_id
    from bot.kernel.runtime.ids import process_alive as process_alive
    from bot.kernel.runtime.ids import replica_id as replica_id
    from bot.kernel.runtime.kube_client import status_message as status_message
    from bot.kernel.runtime.logs import about_incident as about_incident
    from bot.kernel.runtime.logs import basic_logs as basic_logs
    from bot.kernel.runtime.logs import configured_logs as configured_logs
    from bot.kernel.runtime.logs import log_ids as log_ids
    from bot.kernel.runtime.loop import run as run
    from bot.kernel.runtime.metrics import BotMetrics as BotMetrics
    from bot.kernel.runtime.sse import DONE as DONE
    from bot.kernel.runtime.sse import SSEParser as SSEParser
    from bot.kernel.runtime.tasks import TaskSupervisor as TaskSupervisor
    from bot.kernel.runtime.tracing import Spanned as Spanned
    from bot.kernel.runtime.tracing import Tracing as Tracing
    from bot.kernel.runtime.tracing import annotate as annotate
    from bot.kernel.runtime.tracing import span as span
    from bot.kernel.runtime.tracing import start_tracing as start_tracing
    from bot.kernel.runtime.tracing import traced as traced

__all__ = [
    "BotMetrics",
    "DONE",
    "GuardedHttpToolsProtocol",
    "HeadLimits",
    "Members",
    "SSEParser",
    "Spanned",
    "TaskSupervisor",
    "Tracing",
    "about_incident",
    "annotate",
    "basic_logs",
    "configured_logs",
    "is_group",
    "kube_client",
    "log_ids",
    "loop",
    "new_error_id",
    "process_alive",
    "redact",
    "replica_id",
    "run",
    "span",
    "start_tracing",
    "status_message",
    "traced",
    "who_may",
    "with_defaults",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
