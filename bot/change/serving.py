"""After a change or a restore: does the target's engine serve, not just answer /health."""

from __future__ import annotations

import httpx

from bot.kernel import EndpointError
from bot.kernel.runtime.redact import redact


async def verify_serving(base_url: str, *, timeout_s: float = 60.0) -> None:
    """One short completion must succeed: the engine serves, not just answers /health."""
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s) as client:
            models = (await client.get("/v1/models")).raise_for_status().json()
            model = models["data"][0]["id"]
            response = await client.post(
                "/v1/completions",
                json={"model": model, "prompt": [100, 101, 102], "max_tokens": 2},
            )
            response.raise_for_status()
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise EndpointError(redact(f"{base_url} does not serve completions: {exc}")) from exc
