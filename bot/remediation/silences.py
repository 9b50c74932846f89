"""Alertmanager silences through its API v2: one for a target's alerts while a change runs, or
from the incident thread's Silence button (docs/remediation.md#silences).

Only two calls: ``POST /api/v2/silences`` (create) and ``DELETE /api/v2/silence/{id}`` (expire).
A silence always has an end, so one this bot could not expire ends by itself.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import httpx

from bot.kernel import EndpointError, SilenceSpec
from bot.kernel.runtime.redact import redact

CREATED_BY = "ruleloop"
TIMEOUT_S = 10.0


class SilenceError(EndpointError):
    """Alertmanager did not create or expire a silence (unreachable, or it refused)."""


@dataclass(frozen=True)
class Silence:
    """A silence this bot created: its id at that Alertmanager, and when it ends."""

    id: str
    alertmanager_url: str
    ends_at: dt.datetime

    def to_json(self) -> dict[str, Any]:
        """What the remediation record keeps (the sweep expires it from this alone)."""
        return {"id": self.id, "alertmanager_url": self.alertmanager_url,
                "ends_at": self.ends_at.isoformat()}  # fmt: skip


def matchers(target: str, spec: SilenceSpec) -> list[dict[str, Any]]:
    """The target's matchers in API v2's form: equality, not regex ({target} filled in)."""
    return [
        {"name": name, "value": value.replace("{target}", target), "isRegex": False,
         "isEqual": True}
        for name, value in sorted(spec.matchers.items())
    ]  # fmt: skip


async def create(
    target: str, spec: SilenceSpec, *, starts_at: dt.datetime, ends_at: dt.datetime, comment: str
) -> Silence:
    """A silence of ``target``'s alerts from ``starts_at`` to ``ends_at``; SilenceError when
    Alertmanager does not take it."""
    body = {
        "matchers": matchers(target, spec),
        "startsAt": _iso(starts_at),
        "endsAt": _iso(ends_at),
        "createdBy": CREATED_BY,
        "comment": comment,
    }
    answer = await _call("POST", f"{spec.alertmanager_url}/api/v2/silences", json=body)
    try:
        silence_id = str(answer.json()["silenceID"])
    except (ValueError, KeyError, TypeError) as exc:
        raise SilenceError(
            f"Alertmanager at {redact(spec.alertmanager_url)} answered without a silenceID"
        ) from exc
    return Silence(id=silence_id, alertmanager_url=spec.alertmanager_url, ends_at=ends_at)


async def expire(alertmanager_url: str, silence_id: str) -> None:
    """Expire a silence now; one already expired (or gone) counts as done."""
    await _call("DELETE", f"{alertmanager_url}/api/v2/silence/{silence_id}", ok_missing=True)


async def _call(
    method: str, url: str, *, json: dict[str, Any] | None = None, ok_missing: bool = False
) -> httpx.Response:
    try:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
            answer = await client.request(method, url, json=json)
    except httpx.HTTPError as exc:
        raise SilenceError(f"Alertmanager did not answer at {redact(url)}: {exc}") from exc
    if ok_missing and answer.status_code == 404:
        return answer
    # Alertmanager answers 500 "silence ... already expired" to a DELETE of an expired one
    if method == "DELETE" and "already expired" in answer.text:
        return answer
    if answer.status_code >= 300:
        raise SilenceError(
            f"Alertmanager refused {method} {redact(url)}: {answer.status_code} {answer.text[:200]}"
        )
    return answer


def _iso(at: dt.datetime) -> str:
    return at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
