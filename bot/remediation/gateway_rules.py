"""An ADR's ``fix.gateway`` rules, applied through the gateway's admin endpoint and undone.

The gateway translates ADR keys itself (``bot.gateway.limits.from_adr``); here the rules are
sent as the ADR writes them, and the limits in force before are kept so a rollback can PATCH
exactly those back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from bot.adr import GatewayRules
from bot.change.actuators import ActuatorError
from bot.kernel import UsageError
from bot.kernel.runtime.redact import redact

PATH = "/admin/limits"


class GatewayAdmin:
    """GET and PATCH of one gateway's live limits, with its bearer token."""

    def __init__(self, *, url: str, token_file: Path, timeout_s: float = 10.0) -> None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise UsageError(f"cannot read the gateway admin token {token_file}: {exc}") from None
        if not token:
            raise UsageError(f"the gateway admin token file {token_file} is empty")
        self._url = url
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = timeout_s

    async def limits(self) -> dict[str, Any]:
        """The limits in force."""
        return await self._call("GET", None)

    async def apply(self, rules: GatewayRules) -> dict[str, Any]:
        """Set the rules the ADR writes (not the model's defaults); the limits afterwards."""
        return await self._call("PATCH", rules.model_dump(exclude_none=True, exclude_unset=True))

    async def restore(self, limits: dict[str, Any]) -> dict[str, Any]:
        """Put back limits recorded by ``limits()``."""
        return await self._call("PATCH", limits)

    async def _call(self, method: str, body: dict[str, Any] | None) -> dict[str, Any]:
        try:
            async with httpx.AsyncClient(timeout=self._timeout) as client:
                response = await client.request(
                    method, f"{self._url}{PATH}", json=body, headers=self._headers
                )
        except httpx.HTTPError as exc:
            raise ActuatorError(
                redact(f"the gateway at {self._url} did not answer: {exc}")
            ) from exc
        if response.status_code != 200:
            try:  # the gateway answers OpenAI-shaped errors
                why = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                why = response.text
            raise ActuatorError(
                redact(
                    f"the gateway at {self._url} refused {method} {PATH} "
                    f"({response.status_code}): {why}"
                )
            )
        limits: dict[str, Any] = response.json()
        return limits
