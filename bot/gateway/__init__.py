"""The inference gateway: an ASGI reverse proxy that enforces an ADR's runtime rules.

Modules, one noun each: ``app`` (routing, admission, bookkeeping), ``relay`` (one upstream
exchange: streaming, deadline, cancel drain), ``budget`` (in-flight token budget), ``costing``
(token estimate of a request), ``deadlines`` (X-Request-Timeout), ``limits`` (live limits),
``admin`` (the /admin/limits and /admin/requests endpoints), ``records`` (the request records
/admin/requests exports: lengths, arrivals, prefix hashes, never content), ``metrics`` (the
gateway's /metrics: names are a contract), ``engine_page`` (the engine's /metrics at
/engine/metrics), ``responses`` (OpenAI-shaped errors), ``server`` (uvicorn, SIGHUP).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.gateway.app import Gateway as Gateway
    from bot.gateway.costing import Costing as Costing
    from bot.gateway.costing import tokenizer_counter as tokenizer_counter
    from bot.gateway.deadlines import BadTimeout as BadTimeout
    from bot.gateway.deadlines import parse_timeout as parse_timeout
    from bot.gateway.limits import Limits as Limits
    from bot.gateway.limits import LimitsError as LimitsError
    from bot.gateway.limits import read_limits_file as read_limits_file
    from bot.gateway.limits import updated as updated
    from bot.gateway.server import GatewayServer as GatewayServer
    from bot.gateway.server import upstream_client as upstream_client

__all__ = [
    "BadTimeout",
    "Costing",
    "Gateway",
    "GatewayServer",
    "Limits",
    "LimitsError",
    "parse_timeout",
    "read_limits_file",
    "tokenizer_counter",
    "updated",
    "upstream_client",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
