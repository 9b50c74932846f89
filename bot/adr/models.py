"""The ADR record: front matter (what machines read) and body (the seed's three sections).

Front matter fields are the contract (docs/writing-adrs.md). The body is kept as structured
parts (the context text, the Metrics Matrix rows, the solidified rules) so that rendering a
record and parsing it back gives the same record. Matrix numbers are held at the precision the table
shows (0.1 ms, 0.1 %), which is what makes that round trip exact.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationInfo,
    field_validator,
)

from bot.adr.metrics import METRICS
from bot.adr.relative import (
    BEFORE,
    NORMAL,
    NORMAL_METRICS,
    NoNormal,
    Normal,
    Relative,
    dump_value,
    no_normal,
    parse_value,
)
from bot.adr.workload.shape import WorkloadShape
from bot.kernel.numbers import OPS, Bound, catalogue, compact

ID_PATTERN = r"^ADR-\d{8}-\d{2}$"
Status = Literal["proposed", "accepted", "superseded", "rejected"]
EngineValue = bool | int | float | str
# A number, or a multiple of the target's normal ('3x normal'); written back as it was read.
Value = Annotated[float | Relative, PlainValidator(parse_value), PlainSerializer(dump_value)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Condition(_Strict):
    """A symptom: `metric op value`, e.g. ttft_p99_ms > 1000 (no expressions)."""

    metric: str
    op: str
    value: Value

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, metric: str) -> str:
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
        return metric

    @field_validator("op")
    @classmethod
    def _known_op(cls, op: str) -> str:
        if op not in OPS:
            raise ValueError(f"unknown operator {op!r}; use one of {' '.join(OPS)}")
        return op

    @field_validator("value")
    @classmethod
    def _normal_known(cls, value: float | Relative, info: ValidationInfo) -> float | Relative:
        metric = info.data.get("metric")  # absent when the metric itself was refused
        if isinstance(value, Relative) and value.base != NORMAL:
            raise ValueError(
                f"'{value}': a match condition compares the diagnosis with the target's normal "
                f"(write '{value.factor:g}x normal'); 'before' exists only in gates, where the "
                "canary measures the flags serving before the change"
            )
        if isinstance(value, Relative) and metric is not None and metric not in NORMAL_METRICS:
            raise ValueError(
                f"{metric} cannot be '{value}': normal is measured only for "
                f"{', '.join(NORMAL_METRICS)} (use a number for {metric})"
            )
        return value


class GatewayRules(_Strict):
    """What the inference gateway must enforce (the seed's Go gateway, as settings)."""

    require_request_timeout: bool = False
    timeout_header: str = "X-Request-Timeout"
    drop_on_cancel: bool = False
    max_in_flight_tokens: int | None = Field(default=None, ge=1)
    upstream_timeout_s: float | None = Field(default=None, gt=0)


class Fix(_Strict):
    """The pre-approved change: vLLM flags and gateway rules."""

    engine_args: dict[str, EngineValue] = Field(default_factory=dict)
    gateway: GatewayRules | None = None


# gate -> the metric it limits (and whose normal a relative gate multiplies)
GATE_METRICS = catalogue.METRIC_OF
CONFIDENCE = (0.8, 0.999)  # what an ADR's gates may be decided at


class AdrGates(_Strict):
    """Canary limits a change must meet before it is promoted (numbers, or 'Nx normal'), and
    the confidence its per-request gates are decided at."""

    max_ttft_p99_ms: Value | None = None
    max_tpot_p99_ms: Value | None = None
    min_goodput_ratio: Value | None = None
    max_kv_fragmentation: Value | None = None
    max_itl_p99_ms: Value | None = None
    # None: 0.99. Lower decides on fewer requests (a p99 against a limit needs 528 at 0.99,
    # 368 at 0.95) and keeps a change that did nothing more often; the canary says which it used.
    confidence: float | None = None
    # what a canary that could not decide a gate does (None: "rollback", failing safe); "hold"
    # leaves the change on the canary stage for a person to keep or roll back, with buttons,
    # until [remediation] hold_ttl_s passes: then it is rolled back
    inconclusive: Literal["rollback", "hold"] | None = None

    @field_validator(*(m.gate for m in catalogue.METRICS if m.unit == "ms"))
    @classmethod
    def _milliseconds(cls, value: float | Relative | None) -> float | Relative | None:
        if isinstance(value, float) and not value > 0:
            raise ValueError(f"{value:g} ms: a latency limit must be greater than 0")
        return value

    @field_validator(*(m.gate for m in catalogue.METRICS if m.unit == "ratio"))
    @classmethod
    def _ratio(cls, value: float | Relative | None) -> float | Relative | None:
        if isinstance(value, float) and not 0 <= value <= 1:
            raise ValueError(f"{value:g}: a ratio must be between 0 and 1 (95 % is 0.95)")
        return value

    @field_validator("confidence")
    @classmethod
    def _confidence(cls, value: float | None) -> float | None:
        if value is not None and not CONFIDENCE[0] <= value <= CONFIDENCE[1]:
            raise ValueError(
                f"{value:g}: the confidence gates are decided at is a share from "
                f"{CONFIDENCE[0]:g} to {CONFIDENCE[1]:g} (99 % is 0.99, the default)"
            )
        return value

    @classmethod
    def of_numbers(cls, limits: Mapping[str, float]) -> AdrGates:
        """Gates from limits kept as numbers (gate name -> limit), checked as written ones are."""
        return cls.model_validate(dict(limits))

    def is_empty(self) -> bool:
        """No limit is set."""
        return all(getattr(self, key) is None for key in GATE_METRICS)

    @property
    def resolved(self) -> bool:
        """Every limit set is a number (none is relative to a value still to be measured)."""
        return not self.relative()

    def limits(self) -> dict[str, float]:
        """The limits that are numbers, by gate name (a relative one has none until resolved)."""
        return {
            key: value for key in GATE_METRICS if isinstance(value := getattr(self, key), float)
        }

    def relative(self, base: str | None = None) -> dict[str, Relative]:
        """The limits given as multiples of a measured value (of ``base`` only, if given)."""
        return {
            key: value
            for key in GATE_METRICS
            if isinstance(value := getattr(self, key), Relative) and base in (None, value.base)
        }

    def resolve(
        self, normal: Normal, *, before: Normal | None = None, strict: bool = True
    ) -> AdrGates:
        """Absolute limits: each 'Nx normal' times the target's normal value of its metric, each
        'Nx before' times the before-run's value of it (``before``: that canary's numbers).

        A relative gate with nothing to multiply raises NoNormal; with ``strict=False`` it is
        left out instead (where an unresolved gate only means less to show, never less to check).
        """
        limits: dict[str, float | None] = {}
        missing = []
        for key in GATE_METRICS:
            value = getattr(self, key)
            if not isinstance(value, Relative):
                limits[key] = value
                continue
            numbers = (before or {}) if value.base == BEFORE else normal
            resolved = value.of(GATE_METRICS[key], numbers)
            if resolved is None or (key.endswith("_ms") and resolved <= 0):
                why = (
                    _no_before_text(key, before)
                    if value.base == BEFORE
                    else _no_normal_text(key, resolved)
                )
                missing.append(f"{key} is {value} but {why}")
                limits[key] = None
            else:
                # A ratio stays a ratio: 1.2x a normal goodput of 0.9 is "at least 1". Rounded
                # so that 6 x 9.9 is 59.4 on cards and in drafts, not 59.400000000000006.
                limits[key] = round(min(resolved, 1.0) if key in _RATIOS else resolved, 4)
        if missing and strict:
            hint = (
                " (normal is the median of the scheduler's snapshots of the target: [scheduler] "
                "snapshot_every_s; until one is taken, relative gates cannot be checked)"
                if any(f"x {NORMAL} " in text for text in missing)
                else ""
            )
            raise NoNormal("; ".join(missing) + hint)
        return AdrGates(**limits, confidence=self.confidence, inconclusive=self.inconclusive)

    def describe(self, resolved: AdrGates | None = None) -> dict[str, str]:
        """Each gate in words, relative ones with their resolved number: '2x normal (= 180)'."""
        out = {}
        for key in GATE_METRICS:
            value = getattr(self, key)
            if value is None:
                continue
            text = f"{value:g}" if isinstance(value, float) else str(value)
            if isinstance(value, Relative):
                number = None if resolved is None else getattr(resolved, key)
                pending = " (no normal yet)" if value.base == NORMAL else " (after the before-run)"
                text += f" (= {number:g})" if isinstance(number, float) else pending
            out[key] = text
        return out

    def cli_flags(self) -> str:
        """The same limits as `python -m latency_checker` flags ('--max-ttft-p99-ms 350 ...').

        A relative limit has no flag until it is resolved against the numbers it multiplies
        (``resolve``); it is named after a shell comment, so the line still runs and says so.
        """
        flags = " ".join(
            f"--{key.replace('_', '-')} {value:g}"
            for key in GATE_METRICS
            if isinstance(value := getattr(self, key), float)
        )
        relative = self.relative()
        if not relative:
            return flags
        unresolved = ", ".join(f"{key} {value}" for key, value in relative.items())
        note = f"# no flag until resolved against what it multiplies: {unresolved}"
        return f"{flags}  {note}" if flags else note


_RATIOS = tuple(m.gate for m in catalogue.METRICS if m.unit == "ratio")


def _no_before_text(key: str, before: Normal | None) -> str:
    metric = GATE_METRICS[key]
    if before is None:
        return (
            "no before-run measured it (the same canary on the flags serving now did not run, "
            "or could not: the bot's log says why)"
        )
    if before.get(metric) == 0:
        return f"the before-run measured {metric} 0, so a multiple of it is no limit"
    return f"the before-run measured no {metric} (its requests failed, or it streamed no tokens)"


def _no_normal_text(key: str, resolved: float | None) -> str:
    metric = GATE_METRICS[key]
    if resolved is None:
        return no_normal(metric)
    return f"the normal {metric} is 0, so a multiple of it is no limit"


class FrontMatter(_Strict):
    """The YAML front matter of an ADR file."""

    id: str = Field(pattern=ID_PATTERN)
    title: str = Field(min_length=1, max_length=200)
    status: Status
    date: dt.date
    deciders: list[str] = Field(default_factory=list)
    supersedes: list[str] = Field(default_factory=list)
    match: list[Condition] = Field(default_factory=list)
    # The cause(s) this ADR fixes (bot/adr/causes.py); with one named, the ADR is offered only
    # when the diagnosis does not rule it out (bot/adr/match.py by_cause). Names are checked by
    # `ruleloop adr validate`, which knows the runbooks' own causes too.
    cause: list[str] = Field(default_factory=list)
    fix: Fix = Field(default_factory=Fix)
    gates: AdrGates | None = None
    # What the change may do to the numbers its gates do not name and to the target's standing
    # gates (bot/canary/guardrails.py): "block" rolls it back for a regression beyond noise,
    # "warn" keeps it and says so; unset, the target's `[targets.X.canary] guardrails`.
    guardrails: Literal["warn", "block"] | None = None
    # The workload shape the matrix was measured under (bot/adr/workload/shape.py), inline.
    workload: WorkloadShape | None = None

    @field_validator("title")
    @classmethod
    def _one_line(cls, title: str) -> str:
        if "\n" in title or title != title.strip():
            raise ValueError("must be one line without leading or trailing spaces")
        return title

    @field_validator("workload", mode="before")
    @classmethod
    def _inline(cls, value: object) -> object:
        if isinstance(value, str):
            raise ValueError(
                f"{value!r}: write the shape inline (the fields of a shape file: version, "
                "source, captured_at, prompt_tokens, ...; docs/workload.md), not a file name"
            )
        return value

    @field_validator("supersedes", "cause", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("cause")
    @classmethod
    def _cause_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
                raise ValueError(
                    f"{name!r} is not a cause name (lower-case words joined by _, "
                    "e.g. kv_cache_pressure; `ruleloop adr validate` lists the known ones)"
                )
        if len(set(names)) != len(names):
            raise ValueError(f"a cause is named twice: {', '.join(names)}")
        return names

    @field_validator("supersedes")
    @classmethod
    def _ids(cls, ids: list[str]) -> list[str]:
        for adr_id in ids:
            if not re.match(ID_PATTERN, adr_id):
                raise ValueError(f"{adr_id!r} is not an ADR id like ADR-20260831-01")
        return ids


# The matrix's numbers, by their field names (a Literal for mypy; a test holds it to the
# catalogue).
MatrixMetric = Literal["ttft_p99_ms", "tpot_p99_ms", "goodput_ratio", "kv_fragmentation"]


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(float(value), digits)


class MatrixRow(_Strict):
    """One configuration tried: the four metrics (None: not measured) and the verdict; a number
    that is only a histogram bound says so (``bounds``: '≤10ms'), an estimate carries its span
    (``spans``: '12% (0-24%)')."""

    config: str = Field(min_length=1)
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    goodput_ratio: float | None = Field(default=None, ge=0, le=1)
    kv_fragmentation: float | None = Field(default=None, ge=0, le=1)
    verdict: str = ""
    bounds: dict[MatrixMetric, Bound] = Field(default_factory=dict)
    spans: dict[MatrixMetric, tuple[float, float]] = Field(default_factory=dict)

    @field_validator(*(m.key for m in catalogue.MATRIX if m.unit == "ms"))
    @classmethod
    def _tenth_ms(cls, value: float | None) -> float | None:
        return _round(value, 1)

    @field_validator(*(m.key for m in catalogue.MATRIX if m.unit == "ratio"))
    @classmethod
    def _tenth_percent(cls, value: float | None) -> float | None:
        return _round(value, 3)

    @field_validator("spans")
    @classmethod
    def _spans_as_cells(
        cls, spans: dict[str, tuple[float, float]]
    ) -> dict[str, tuple[float, float]]:
        # to the cell's resolution, so a rendered matrix parses back to the same row
        digits = {k: 1 if k.endswith("_ms") else 3 for k in spans}
        out = {}
        for key, (low, high) in spans.items():
            if low > high:
                raise ValueError(f"{key}: a span's low end {low} is above its high end {high}")
            out[key] = (round(low, digits[key]), round(high, digits[key]))
        return out

    @field_validator("config", "verdict")
    @classmethod
    def _cell(cls, text: str) -> str:
        if "\n" in text:
            raise ValueError("a table cell must be one line")
        return text.strip()

    def cell(self, key: MatrixMetric) -> str:
        """One number's cell: '1200ms', '≤10ms', '12% (0-24%)', '-'."""
        unit = "ms" if key.endswith("_ms") else "ratio"
        return compact(getattr(self, key), unit, self.bounds.get(key), self.spans.get(key))


class Adr(FrontMatter):
    """A whole ADR: front matter plus the body's structured parts."""

    context: str = ""
    matrix: list[MatrixRow] = Field(default_factory=list)
    matrix_notes: str = ""
    rules: list[str] = Field(default_factory=list)
    notes: str = ""

    @field_validator("context", "matrix_notes")
    @classmethod
    def _no_section_breaks(cls, text: str) -> str:
        for line in text.splitlines():
            if line.startswith("## "):
                raise ValueError(
                    f"the line {line!r} would start a new section; use ### or **bold**"
                )
        return text.strip()

    @field_validator("matrix_notes")
    @classmethod
    def _no_rows(cls, text: str) -> str:
        for line in text.splitlines():
            if line.lstrip().startswith("|"):
                raise ValueError(f"the line {line!r} would be read as a Metrics Matrix row")
        return text

    @field_validator("notes")
    @classmethod
    def _notes(cls, text: str) -> str:
        text = text.strip()
        if text and not text.startswith("## "):
            raise ValueError("extra sections after section 3 must start with a '## ' heading")
        return text

    @field_validator("rules")
    @classmethod
    def _rules(cls, rules: list[str]) -> list[str]:
        # One rule may span lines; blank lines and trailing spaces cannot survive a round trip.
        lines = (
            ("\n".join(ln.rstrip() for ln in r.strip().splitlines() if ln.strip())) for r in rules
        )
        return [rule for rule in lines if rule]

    def front_matter(self) -> dict[str, object]:
        """The front matter as plain data, in contract order, unset optional parts left out."""
        data = self.model_dump(
            mode="json", include=set(FrontMatter.model_fields) - {"workload"}, exclude_none=True
        )
        data["date"] = self.date  # YAML has dates; as a string it would come out quoted
        if not self.cause:  # no field when none is named; one cause as a plain name
            del data["cause"]
        elif len(self.cause) == 1:
            data["cause"] = self.cause[0]
        if self.workload is not None:
            # every field, as a shape file writes it: the block can be copied out into one
            data["workload"] = self.workload.model_dump(mode="json")
        return data
