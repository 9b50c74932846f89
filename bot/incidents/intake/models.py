"""Alertmanager's webhook payload, version 4 (unknown fields are tolerated and ignored).

https://prometheus.io/docs/alerting/latest/configuration/#webhook_config
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy import ColumnElement, String

from bot.incidents.intake import nesting
from bot.kernel import RequestRejected
from bot.kernel.store import Alert, Incident

Status = Literal["firing", "resolved"]


def _width(column: ColumnElement[Any]) -> int:
    """The length of a String column: what PostgreSQL would refuse past (SQLite never does)."""
    assert isinstance(column.type, String) and column.type.length, column
    return column.type.length


# Longer values are refused at intake (422): in the store they were a DataError, answered 503,
# which Alertmanager retried forever.
FINGERPRINT_MAX = _width(Alert.__table__.c.fingerprint)
TIME_MAX = min(_width(Alert.__table__.c.starts_at), _width(Alert.__table__.c.ends_at))
GROUP_KEY_MAX = _width(Incident.__table__.c.key)
# Alertmanager's payload nests 4 deep (alerts, an alert, its labels); the rest is room for
# senders' extra fields. Deeper is refused before parsing (bot.incidents.intake.nesting).
MAX_DEPTH = 32
# A body is refused before parsing when it holds more values than a notification under the
# size cap can (1 MiB of the smallest real alerts: about 130,000 separators; 1 MiB of `1,` is
# 524,288), and before validation when its alerts or labels are not what Alertmanager sends:
# validation builds an error per wrong entry (a 1 MiB list of 1s as `alerts` took 660 MB).
MAX_VALUES = 200_000
MAX_ALERTS = 10_000
MAX_LABELS = 1_000  # labels (or annotations) of one alert or of the group


@dataclass(frozen=True)
class AlertTime:
    """startsAt as sent (half of the dedupe key, stored exactly) and the time it says, parsed
    once here (stored beside it: nothing reads the text back as a time)."""

    text: str
    at: dt.datetime


def _alert_time(value: object) -> AlertTime:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be an RFC 3339 time, e.g. 2026-09-01T05:00:00Z")
    if len(value) > TIME_MAX:
        raise ValueError(f"is {len(value)} characters; a time has at most {TIME_MAX}")
    return AlertTime(value, parse_time(value))


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class WebhookAlert(_Lenient):
    """One alert of a notification."""

    status: Status
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: Annotated[AlertTime, BeforeValidator(_alert_time)] = Field(alias="startsAt")
    ends_at: str | None = Field(default=None, alias="endsAt", max_length=TIME_MAX)
    generator_url: str | None = Field(default=None, alias="generatorURL")
    fingerprint: str = Field(default="", max_length=FINGERPRINT_MAX)

    @cached_property  # the payload's dedupe and the intake both ask: the labels hashed once
    def key(self) -> tuple[str, str]:
        """The alert instance: fingerprint (derived from labels if missing) and startsAt."""
        return (self.fingerprint or label_fingerprint(self.labels), self.starts_at.text)


class Webhook(_Lenient):
    """A notification: one alert group at one moment."""

    version: Literal["4"]
    group_key: str = Field(alias="groupKey", min_length=1, max_length=GROUP_KEY_MAX)
    status: Status
    receiver: str = ""
    group_labels: dict[str, str] = Field(default_factory=dict, alias="groupLabels")
    common_labels: dict[str, str] = Field(default_factory=dict, alias="commonLabels")
    common_annotations: dict[str, str] = Field(default_factory=dict, alias="commonAnnotations")
    external_url: str = Field(default="", alias="externalURL")
    truncated_alerts: int = Field(default=0, alias="truncatedAlerts")
    alerts: list[WebhookAlert] = Field(min_length=1)

    @field_validator("alerts")
    @classmethod
    def _one_per_instance(cls, alerts: list[WebhookAlert]) -> list[WebhookAlert]:
        # An instance twice in one payload (a relay or a hand-made payload, not Alertmanager)
        # made the store's unique key fail on every retry; the later copy is the newer state.
        latest = {alert.key: alert for alert in alerts}
        return list(latest.values())

    @property
    def labels(self) -> dict[str, str]:
        """The group's labels for runbook selection: the common ones, and an alert name always."""
        first = next((a for a in self.alerts if a.status == "firing"), self.alerts[0])
        name = self.common_labels.get("alertname") or first.labels.get("alertname")
        return {**self.common_labels, **({"alertname": name} if name else {})}

    @property
    def title(self) -> str:
        """A one-line title: the alert name and the group's labels."""
        names = sorted({a.labels.get("alertname", "") for a in self.alerts} - {""})
        name = " + ".join(names) or "alert"
        rest = ", ".join(
            f"{k}={v}" for k, v in sorted(self.group_labels.items()) if k != "alertname"
        )
        return f"{name} ({rest})" if rest else name


def parse_time(value: str) -> dt.datetime:
    """An RFC 3339 time as Alertmanager writes it (nanoseconds allowed) -> aware datetime."""
    text = value.strip().replace("Z", "+00:00")
    head, dot, tail = text.partition(".")
    if dot:  # Python takes at most 6 fractional digits
        digits = len(tail) - len(tail.lstrip("0123456789"))
        tail = tail[: min(digits, 6)] + tail[digits:]
        text = f"{head}.{tail}"
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{value!r} is not an RFC 3339 time") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def label_fingerprint(labels: dict[str, str]) -> str:
    """A stable fingerprint from labels, for senders that omit Alertmanager's own."""
    canonical = json.dumps(sorted(labels.items()), separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _refuse_unlike_alertmanager(data: Mapping[str, object]) -> None:
    """At most MAX_ALERTS alerts, each an object, and label maps of at most MAX_LABELS texts:
    checked before validation, which would build an error for every entry that is not one
    (half a million of them in a 1 MiB body)."""
    for name in ("groupLabels", "commonLabels", "commonAnnotations"):
        _refuse_label_map(name, data.get(name))
    alerts = data.get("alerts")
    if not isinstance(alerts, list):
        return  # validation says what is wrong with it
    if len(alerts) > MAX_ALERTS:
        raise RequestRejected(
            f"{len(alerts):,} alerts in one notification, at most {MAX_ALERTS:,}: set "
            "max_alerts on the receiver (Alertmanager counts the rest in truncatedAlerts)",
            status=413,
        )
    for n, alert in enumerate(alerts):
        if not isinstance(alert, dict):
            raise RequestRejected(
                f"not an Alertmanager webhook v4 payload: alerts.{n}: an alert is an object",
                status=422,
            )
        for name in ("labels", "annotations"):
            _refuse_label_map(f"alerts.{n}.{name}", alert.get(name))


def _refuse_label_map(where: str, labels: object) -> None:
    if not isinstance(labels, dict):
        return  # validation says what is wrong with it
    if len(labels) > MAX_LABELS:
        raise RequestRejected(
            f"not an Alertmanager webhook v4 payload: {where}: {len(labels):,} entries, at "
            f"most {MAX_LABELS:,}", status=413,
        )  # fmt: skip
    for key, value in labels.items():
        if not isinstance(value, str):
            raise RequestRejected(
                f"not an Alertmanager webhook v4 payload: {where}.{key}: a label value is "
                "text", status=422,
            )  # fmt: skip


def parse_webhook(body: bytes) -> Webhook:
    """Parse a request body; RequestRejected (400 or 422) that says what is wrong."""
    values = nesting.values(body)  # checked on the bytes: nothing built yet
    if values > MAX_VALUES:
        raise RequestRejected(
            f"body holds too many JSON values (up to {values:,}; at most {MAX_VALUES:,}, more "
            "than 1 MiB of real alerts holds): not an Alertmanager notification", status=413,
        )  # fmt: skip
    if nesting.depth(body) > MAX_DEPTH:
        raise RequestRejected(
            f"body is not usable JSON: nested too deeply (over {MAX_DEPTH} levels; "
            "an Alertmanager webhook has 4)", status=400,
        )  # fmt: skip
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestRejected(f"body is not JSON: {exc}", status=400) from None
    except RecursionError:  # e.g. 200,000 nested arrays: the parser's stack runs out
        raise RequestRejected("body is not usable JSON: nested too deeply", status=400) from None
    if not isinstance(data, dict):
        raise RequestRejected("body must be a JSON object (Alertmanager webhook v4)", status=400)
    _refuse_unlike_alertmanager(data)
    refuse_unstorable(data)
    try:
        return Webhook.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "payload"
        raise RequestRejected(
            f"not an Alertmanager webhook v4 payload: {where}: {first['msg']}", status=422
        ) from None


def refuse_unstorable(data: object) -> None:
    """RequestRejected (422, naming the field) for text no store can hold: a NUL character
    (PostgreSQL refused it with a DataError, answered 503, which Alertmanager retried forever;
    SQLite took it) or a lone surrogate (not UTF-8: a 500). Any string of the payload, keys too."""
    # A value's place is (its parent's place, its key): one pair per value, the dotted path
    # spelled out only for the one refused.
    stack: list[tuple[_Place, object]] = [(None, data)]
    while stack:  # iterative: a body as deep as json.loads allows is not a RecursionError here
        where, value = stack.pop()
        keys: list[str] = []
        if isinstance(value, str):
            keys = [value]
        elif isinstance(value, dict):
            keys = list(value)
            stack.extend(((where, str(k)), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend(((where, str(n)), v) for n, v in reversed(list(enumerate(value))))
        for text in keys:
            why = _unstorable(text)
            if why:
                field = _spelled(where) or "payload"
                what = "" if isinstance(value, str) else "a key "
                raise RequestRejected(
                    f"not an Alertmanager webhook v4 payload: {field}: {what}{why}", status=422
                )


_Place = tuple["_Place", str] | None


def _spelled(place: _Place) -> str:
    names: list[str] = []
    while place is not None:
        place, name = place
        names.append(name)
    return ".".join(reversed(names))


def _unstorable(value: str) -> str | None:
    if "\x00" in value:
        return "contains a NUL character (\\u0000), which the incident store cannot hold"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not Unicode text), which the incident store cannot hold"
    return None
