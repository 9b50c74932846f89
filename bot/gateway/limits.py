"""The gateway's runtime limits, and how they change while it runs (admin endpoint, SIGHUP).

A change is validated as a whole (pydantic, unknown keys refused) and swapped in at once; open
streams keep the admission they had, so applying an ADR's ``fix.gateway`` rules drops nothing.
Durations accept the X-Request-Timeout syntax (``30``, ``2.5s``, ``500ms``). An ADR's
``fix.gateway`` block can be applied as it is written: its keys are translated (``ADR_KEYS``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from bot.gateway.deadlines import BadTimeout, parse_timeout

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """Limits in force; ``max_inflight_tokens`` 0 means no token budget."""

    max_inflight_tokens: int = 0
    default_timeout_s: float = 600.0
    max_timeout_s: float = 3600.0
    max_body_bytes: int = 8 * MiB
    retry_after_s: int = 1
    default_max_tokens: int = 1024
    require_timeout_header: bool = False

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (the admin endpoint's JSON)."""
        return dataclasses.asdict(self)


class LimitsUpdate(BaseModel):
    """A partial change of limits, as the admin endpoint or a limits file gives it."""

    model_config = ConfigDict(extra="forbid")

    max_inflight_tokens: int | None = Field(default=None, ge=0)
    default_timeout_s: float | None = None
    max_timeout_s: float | None = None
    max_body_bytes: int | None = Field(default=None, ge=1024)
    retry_after_s: int | None = Field(default=None, ge=1)
    default_max_tokens: int | None = Field(default=None, ge=1)
    require_timeout_header: StrictBool | None = None  # true or false: not 1, not "yes"

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: object, info: ValidationInfo) -> object:
        # pydantic reads true as 1 and false as 0 for a number: {"max_inflight_tokens": true}
        # became a budget of one token
        if isinstance(value, bool) and info.field_name != "require_timeout_header":
            raise ValueError("must be a number, not true or false")
        return value

    @field_validator("default_timeout_s", "max_timeout_s", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                return parse_timeout(value)
            except BadTimeout as exc:
                raise ValueError(str(exc).replace("X-Request-Timeout", "duration")) from None
        if isinstance(value, int | float) and not isinstance(value, bool) and value <= 0:
            raise ValueError("must be a positive duration")
        return value


class LimitsError(ValueError):
    """A limits change that cannot be applied; the message says what to fix, ``fields`` where."""

    def __init__(self, message: str, *, fields: list[str] | None = None) -> None:
        super().__init__(message)
        self.fields = fields or []


# An ADR's fix.gateway keys (bot.adr.models.GatewayRules) -> the limit each one sets.
ADR_KEYS = {
    "max_in_flight_tokens": "max_inflight_tokens",
    "upstream_timeout_s": "default_timeout_s",
    "require_request_timeout": "require_timeout_header",
}


def from_adr(change: Mapping[str, Any]) -> dict[str, Any]:
    """Translate ADR ``fix.gateway`` keys; refuse rules this gateway cannot honour as written."""
    out: dict[str, Any] = {}
    for key, value in change.items():
        if key == "timeout_header":
            if str(value).lower() != "x-request-timeout":
                raise LimitsError(
                    f"timeout_header {value!r}: this gateway reads X-Request-Timeout only"
                )
        elif key == "drop_on_cancel":
            if value is not True:
                raise LimitsError(
                    "drop_on_cancel must be true: this gateway always drops cancelled work"
                )
        elif value is not None or key not in ADR_KEYS:
            out[ADR_KEYS.get(key, key)] = value
    return out


def updated(limits: Limits, change: Mapping[str, Any]) -> Limits:
    """``limits`` with ``change`` applied; raise LimitsError when the change is invalid."""
    try:
        update = LimitsUpdate.model_validate(from_adr(change))
    except ValidationError as exc:
        where = [".".join(str(p) for p in e["loc"]) or "body" for e in exc.errors()]
        problems = "; ".join(f"{w}: {e['msg']}" for w, e in zip(where, exc.errors(), strict=True))
        raise LimitsError(problems, fields=list(dict.fromkeys(where))) from None
    new = dataclasses.replace(limits, **update.model_dump(exclude_none=True))
    if new.default_timeout_s > new.max_timeout_s:
        raise LimitsError(
            f"default_timeout_s ({new.default_timeout_s:g}) is above max_timeout_s "
            f"({new.max_timeout_s:g})",
            fields=["default_timeout_s"],
        )
    return new


def read_limits_file(path: Path) -> dict[str, Any]:
    """The mapping in a YAML or JSON limits file; raise LimitsError when unreadable."""
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise LimitsError(f"cannot read limits file {path}: {exc}") from None
    except RecursionError:  # e.g. 30,000 nested arrays: the parser's stack runs out
        raise LimitsError(f"cannot read limits file {path}: nested too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise LimitsError(f"limits file {path} must hold a mapping of limit names to values")
    return data
