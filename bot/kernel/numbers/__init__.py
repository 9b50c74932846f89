"""The four numbers: which they are and how each is gated, matched and kept (``catalogue``),
what each one is (value, source, bound) and how every surface shows it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.kernel.numbers.catalogue import BY_GATE as BY_GATE
    from bot.kernel.numbers.catalogue import HEADLINE as HEADLINE
    from bot.kernel.numbers.histogram import histogram_quantile as histogram_quantile
    from bot.kernel.numbers.histogram import quantile_bound as quantile_bound
    from bot.kernel.numbers.histogram import quantile_bucket as quantile_bucket
    from bot.kernel.numbers.reading import OPS as OPS
    from bot.kernel.numbers.reading import Bound as Bound
    from bot.kernel.numbers.reading import Estimate as Estimate
    from bot.kernel.numbers.reading import Measured as Measured
    from bot.kernel.numbers.reading import MeasuredJson as MeasuredJson
    from bot.kernel.numbers.reading import Reading as Reading
    from bot.kernel.numbers.reading import bounds_of as bounds_of
    from bot.kernel.numbers.reading import compare as compare
    from bot.kernel.numbers.reading import spans_of as spans_of
    from bot.kernel.numbers.text import FOUR as FOUR
    from bot.kernel.numbers.text import NOT_MEASURED as NOT_MEASURED
    from bot.kernel.numbers.text import change as change
    from bot.kernel.numbers.text import compact as compact
    from bot.kernel.numbers.text import in_unit as in_unit
    from bot.kernel.numbers.text import show as show
    from bot.kernel.numbers.text import show_reading as show_reading
    from bot.kernel.numbers.text import sign_of as sign_of
    from bot.kernel.numbers.text import unit_of as unit_of

__all__ = [
    "BY_GATE",
    "Bound",
    "Estimate",
    "FOUR",
    "HEADLINE",
    "Measured",
    "MeasuredJson",
    "NOT_MEASURED",
    "OPS",
    "Reading",
    "bounds_of",
    "catalogue",
    "change",
    "compact",
    "compare",
    "histogram_quantile",
    "in_unit",
    "quantile_bound",
    "quantile_bucket",
    "show",
    "show_reading",
    "sign_of",
    "spans_of",
    "unit_of",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
