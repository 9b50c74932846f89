"""The inference gateway: an ASGI reverse proxy that enforces an ADR's runtime rules.

Modules, one noun each: ``app`` (routing, admission, bookkeeping), ``relay`` (one upstream
exchange: streaming, deadline, cancel drain), ``budget`` (in-flight token budget), ``costing``
(token estimate of a request), ``deadlines`` (X-Request-Timeout), ``limits`` (live limits),
``admin`` (the /admin/limits and /admin/requests endpoints), ``records`` (the request records
/admin/requests exports: lengths, arrivals, prefix hashes, never content), ``metrics`` (the
gateway's /metrics: names are a contract), ``engine_page`` (the engine's /metrics at
/engine/metrics), ``responses`` (OpenAI-shaped errors), ``server`` (uvicorn, SIGHUP).
"""
