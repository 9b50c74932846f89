"""The one way a number is written, on every surface: Slack, the incident page, the console, the
demo's screen, the canary's table (``show``), and the seed's compact form in ADR matrices and
gate verdicts (``compact``).

Latencies in milliseconds ("41.3 ms", "212 ms" from 100 ms up, "1,710 ms"), ratios in percent
("93.0 %"), a bound with its sign ("≤ 10.0 ms", "> 20,000 ms"), an estimate with its span
("12.0 % (0.0–24.0 %)"; compact "12% (0-24%)"), a failed request's unbounded
latency as "∞", and a number not measured as "n/a". The compact form is the seed ADR's table:
"1200ms", "117.8ms", "62%", "∞", "-".
"""

from __future__ import annotations

import math
from collections.abc import Callable

from bot.kernel.numbers import catalogue
from bot.kernel.numbers.reading import Bound, Reading

# The four headline numbers (the catalogue's): key, label, unit, and whether bigger is worse.
FOUR = tuple((m.key, m.label, m.unit, m.worse_up) for m in catalogue.HEADLINE)
NOT_MEASURED = "n/a"
_RATIOS = (
    *(m.key for m in catalogue.METRICS if m.unit == "ratio"),
    "kv_cache_usage",
    "slo_attainment",
)


def unit_of(key: str) -> str:
    """'ms' for latencies, 'ratio' for shares, '' for counts and rates."""
    if key in catalogue.BY_KEY:
        return catalogue.BY_KEY[key].unit
    if key.endswith("_ms"):
        return "ms"
    if key in _RATIOS or key.endswith(("_ratio", "_share", "_rate")):
        return "ratio"
    return ""


def in_unit(value: float, unit: str) -> str:
    """The bare number in its unit: '41.3 ms', '212 ms', '1,710 ms', '93.0 %', '4.5'."""
    if math.isinf(value):
        return "∞"
    if unit == "ms":
        return f"{value:,.0f} ms" if abs(value) >= 100 else f"{value:.1f} ms"
    if unit == "ratio":
        return f"{value * 100:.1f} %"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def show(
    key: str,
    value: float | None,
    bound: Bound | str | None = None,
    span: tuple[float, float] | None = None,
) -> str:
    """A metric's number as every surface writes it, a bound with its sign, an estimate with
    its span."""
    if value is None or math.isnan(value):
        return NOT_MEASURED
    unit = unit_of(key)
    text = in_unit(value, unit)
    if bound is not None:
        return f"{sign_of(bound)} {text}"
    if span is not None and _wide(span, unit, in_unit):
        return f"{text} ({_range(span, unit, in_unit, ' ')})"
    return text


def show_reading(key: str, reading: Reading | None) -> str:
    """``show`` for a Reading (None: not measured)."""
    if reading is None:
        return NOT_MEASURED
    return show(key, reading.value, reading.bound, reading.span)


def sign_of(bound: Bound | str) -> str:
    """'≤' for a number at most its edge, '>' for one beyond the last."""
    return "≤" if Bound(bound) is Bound.AT_MOST else ">"


def _wide(span: tuple[float, float], unit: str, write: Callable[[float, str], str]) -> bool:
    """A span whose ends differ as written (a point estimate reads as a number)."""
    return write(span[0], unit) != write(span[1], unit)


def _range(
    span: tuple[float, float], unit: str, write: Callable[[float, str], str], gap: str
) -> str:
    """'0.0–24.0 %': both ends in the unit, the unit written once."""
    suffix = {"ms": f"{gap}ms", "ratio": f"{gap}%"}.get(unit, "")
    low, high = (write(x, unit).removesuffix(suffix) for x in span)
    return f"{low}–{high}{suffix}" if gap else f"{low}-{high}{suffix}"


def change(key: str, was: float, now: float) -> str:
    """A number against the before-run of the same canary: '1,710 → 215 ms (-87 %)'."""
    unit = unit_of(key)
    was_text, now_text = in_unit(was, unit), in_unit(now, unit)
    suffix = {"ms": " ms", "ratio": " %"}.get(unit, "")
    shown = f"{was_text.removesuffix(suffix)} → {now_text}"
    if was == 0 or math.isinf(was) or math.isinf(now):
        return shown
    return f"{shown} ({(now - was) / was * 100:+.0f} %)"


def compact(
    value: float | None,
    unit: str,
    bound: Bound | str | None = None,
    span: tuple[float, float] | None = None,
) -> str:
    """The seed's table form (ADR matrices, gate verdicts): '1200ms', '117.8ms', '62%', '∞', '-';
    a bound '≤10ms' / '>20000ms', an estimate '12% (0-24%)'."""
    if value is None or math.isnan(value):
        return "-"
    if math.isinf(value):
        return "∞"
    text = _compact(value, unit)
    if bound is not None:
        return sign_of(bound) + text
    if span is not None and _wide(span, unit, _compact):
        return f"{text} ({_range(span, unit, _compact, '')})"
    return text


def _compact(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{value:.1f}".removesuffix(".0") + "ms"
    return f"{value * 100:.1f}".removesuffix(".0") + "%"
