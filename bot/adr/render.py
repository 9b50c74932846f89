"""Renders an ADR record as Markdown with YAML front matter (template: bot/templates/adr.md.j2)."""

from __future__ import annotations

import functools

import jinja2
import yaml

from bot.adr.models import Adr
from bot.adr.workload.describe import context_line
from bot.kernel.numbers import catalogue, compact

TEMPLATE = "adr.md.j2"


def format_ms(value: float | None) -> str:
    """A matrix latency cell: '1200ms', '117.8ms', '∞' (failed requests), '-' (not measured)."""
    return compact(value, "ms")


def format_pct(value: float | None) -> str:
    """A matrix ratio cell as a percentage: '62%', '18.4%', or '-' when not measured."""
    return compact(value, "ratio")


def format_cell(text: str) -> str:
    """Free text for a table cell, with its pipes escaped."""
    return text.replace("|", "\\|")


@functools.cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("bot", "templates"),
        autoescape=False,  # Markdown, not HTML  # noqa: S701
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(ms=format_ms, pct=format_pct, cell=format_cell)
    env.globals["matrix"] = catalogue.MATRIX  # the Metrics Matrix's number columns
    return env


def front_matter_yaml(adr: Adr) -> str:
    """The front matter as YAML, fields in contract order, non-ASCII text kept readable."""
    return yaml.safe_dump(
        adr.front_matter(), sort_keys=False, allow_unicode=True, default_flow_style=False, width=100
    )


def render(adr: Adr) -> str:
    """The ADR as Markdown: YAML front matter, then the seed's three sections; the Context
    section ends with the line saying which workload the matrix was measured under, when the
    front matter records it (``workload:``)."""
    template = _environment().get_template(TEMPLATE)
    workload_line = context_line(adr.workload) if adr.workload is not None else ""
    return template.render(
        adr=adr, front_matter=front_matter_yaml(adr), workload_line=workload_line
    )
