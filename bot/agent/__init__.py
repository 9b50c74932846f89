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
