"""`ruleloop agent`: a read-only NVML snapshot server that runs where the GPUs are.

The bot's pod has no GPU on Kubernetes; the agent runs beside vLLM (a sidecar or a DaemonSet
on GPU nodes) and the bot's ``nvml`` probe reads it over HTTP with a bearer token.

  reading.py   NVML -> one JSON-ready snapshot (shared with the probe's in-process reading)
  xid.py       XID errors, which NVML reports only as events to a listening process
  session.py   NVML initialised once, read under a lock, XID watcher alongside
  app.py       the HTTP API: GET /snapshot (token), GET /healthz
  server.py    uvicorn on a pre-bound socket, stopped by SIGTERM/SIGINT
  client.py    the bot's side: fetch a snapshot, every failure as one clear AgentError
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.agent.app import DEFAULT_PROCESSES as DEFAULT_PROCESSES
    from bot.agent.app import create_app as create_app
    from bot.agent.client import AgentError as AgentError
    from bot.agent.client import fetch_snapshot as fetch_snapshot
    from bot.agent.client import read_token_file as read_token_file
    from bot.agent.reading import NvmlUnavailable as NvmlUnavailable
    from bot.agent.reading import import_pynvml as import_pynvml
    from bot.agent.reading import read_once as read_once
    from bot.agent.server import serve as serve
    from bot.agent.session import NvmlSession as NvmlSession

__all__ = [
    "AgentError",
    "DEFAULT_PROCESSES",
    "NvmlSession",
    "NvmlUnavailable",
    "create_app",
    "fetch_snapshot",
    "import_pynvml",
    "read_once",
    "read_token_file",
    "serve",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
