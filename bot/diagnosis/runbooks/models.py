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
causes:                       # optional: causes beyond bot/adr/causes.py's, with their titles
  - {name: slow_tokenizer, title: "the tokenizer holds up the frontend"}
hypotheses:
  - cause: prefill_decode_mixing
    supported_when: vllm_metrics.max_step_tokens > 4096 and vllm_metrics.tpot_p99_ms > 100
    ruled_out_when: vllm_metrics.max_step_tokens <= 2048
    number: "{vllm_metrics.max_step_tokens} tokens in one scheduler step"
    evidence: "scheduler steps reached {vllm_metrics.max_step_tokens} tokens beside decode"
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bot.diagnosis.runbooks.conditions import READING_NAME, RunbookCondition, clause, parse
from bot.kernel.numbers import OPS

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
        try:
            clause(when)
        except ValueError:
            raise ValueError(
                f"{when[:80]!r} is not `probe.reading OP number` (OP one of {' '.join(OPS)})"
            ) from None
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
        except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
            raise ValueError(f"message may use only {{value}} and {{limit}}: {exc}") from None
        return message

    @property
    def parts(self) -> tuple[str, str, str, float]:
        """(probe, reading, op, limit)."""
        found = clause(self.when)
        probe, _, reading = found.reading.partition(".")
        return probe, reading, found.op, found.limit


# `{probe.reading}` in a hypothesis's number or evidence: the reading, written as everywhere
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


class DeclaredCause(_Strict):
    """A cause this runbook file adds to the built-in vocabulary (bot/adr/causes.py)."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    title: str = Field(min_length=1)


class Hypothesis(_Strict):
    """A cause, the condition that supports it and the one that rules it out, and how its
    number and evidence read (``{probe.reading}`` placeholders)."""

    cause: str
    supported_when: str
    ruled_out_when: str | None = None  # without it: ruled out when supported_when is false
    number: str
    evidence: str

    @field_validator("supported_when", "ruled_out_when")
    @classmethod
    def _condition(cls, when: str | None) -> str | None:
        if when is not None:
            parse(when)  # ValueError says which part and what to write
        return when

    @field_validator("number", "evidence")
    @classmethod
    def _template(cls, text: str) -> str:
        for name in PLACEHOLDER.findall(text):
            if not READING_NAME.match(name):
                raise ValueError(
                    f"{{{name}}} is not a reading: write {{probe.reading}}, e.g. "
                    "{vllm_metrics.tpot_p99_ms}"
                )
        return text

    @property
    def supported(self) -> RunbookCondition:
        """The supporting condition, parsed."""
        return parse(self.supported_when)

    @property
    def ruled_out(self) -> RunbookCondition | None:
        """The ruling-out condition, parsed (None: the supporting one decided false)."""
        return None if self.ruled_out_when is None else parse(self.ruled_out_when)

    @property
    def readings(self) -> list[str]:
        """Every reading it names: conditions first, then number and evidence."""
        names = [*self.supported.readings, *(self.ruled_out.readings if self.ruled_out else [])]
        names += PLACEHOLDER.findall(self.number) + PLACEHOLDER.findall(self.evidence)
        return list(dict.fromkeys(names))


class Runbook(_Strict):
    """One runbook file."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = ""
    match: dict[str, str | list[str]] = Field(default_factory=dict)
    probes: list[ProbeStep] = Field(min_length=1)
    findings: list[FindingRule] = Field(default_factory=list)
    causes: list[DeclaredCause] = Field(default_factory=list)
    hypotheses: list[Hypothesis] = Field(default_factory=list)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether an alert with these labels is this runbook's (empty match: every alert)."""
        for key, wanted in self.match.items():
            allowed = [wanted] if isinstance(wanted, str) else wanted
            if labels.get(key) not in allowed:
                return False
        return True
