"""A runbook file, as pydantic models: which alerts it is for, which probes, which findings.

name: vllm-latency
match:                        # alert labels; a list means any of these values
  alertname: [VLLMTimeToFirstTokenP99High, VLLMQueueTimeHigh]
probes:
  - probe: vllm_metrics
    params: {window_s: 10, interval_s: 1}
findings:
  - when: vllm_metrics.ttft_p99_ms > 1000
    severity: critical
    message: "TTFT p99 is {value:.0f} ms, over the {limit:.0f} ms limit"
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bot.numbers.reading import OPS

_WHEN = re.compile(r"^\s*(?P<probe>[A-Za-z_]\w*)\.(?P<reading>\w+)\s*(?P<op>[<>]=?|==|!=)\s*"
                   r"(?P<value>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*$")  # fmt: skip
SEVERITIES = ("info", "warning", "critical")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProbeStep(_Strict):
    """Run one probe with these parameters (validated against the probe's model at startup)."""

    probe: str
    params: dict[str, Any] = Field(default_factory=dict)


class FindingRule(_Strict):
    """`probe.reading op number` -> a finding of this severity with this message."""

    when: str
    severity: str
    message: str

    @field_validator("when")
    @classmethod
    def _condition(cls, when: str) -> str:
        if not _WHEN.match(when):
            raise ValueError(
                f"{when!r} is not `probe.reading OP number` (OP one of {' '.join(OPS)})"
            )
        return when

    @field_validator("severity")
    @classmethod
    def _severity(cls, severity: str) -> str:
        if severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}")
        return severity

    @field_validator("message")
    @classmethod
    def _template(cls, message: str) -> str:
        try:
            message.format(value=1.0, limit=1.0)
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise ValueError(f"message may use only {{value}} and {{limit}}: {exc}") from None
        return message

    @property
    def parts(self) -> tuple[str, str, str, float]:
        """(probe, reading, op, limit)."""
        m = _WHEN.match(self.when)
        assert m is not None
        return m["probe"], m["reading"], m["op"], float(m["value"])


class Runbook(_Strict):
    """One runbook file."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = ""
    match: dict[str, str | list[str]] = Field(default_factory=dict)
    probes: list[ProbeStep] = Field(min_length=1)
    findings: list[FindingRule] = Field(default_factory=list)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether an alert with these labels is this runbook's (empty match: every alert)."""
        for key, wanted in self.match.items():
            allowed = [wanted] if isinstance(wanted, str) else wanted
            if labels.get(key) not in allowed:
                return False
        return True
