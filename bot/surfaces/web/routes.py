"""The incident page's HTTP routes: the index, one page per incident, and its chart.

Every route checks its signed link first (``bot.surfaces.web.links``): a missing, forged or
expired one
is a 403 page that says which and what to do. Pages are server-rendered Jinja2 with inline CSS
and no script; the Content-Security-Policy allows nothing else, and no page sends a Referer
(the link's signature is in its URL).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from bot.adr import Adr
from bot.adr.render import render
from bot.diagnosis import ChartData, render_chart
from bot.kernel.store import Database
from bot.surfaces.web import queries
from bot.surfaces.web.links import INDEX, LinkRefused, PageLinks, incident_subject
from bot.surfaces.web.view import incident_page, index_rows

HEADERS = {
    "Content-Security-Policy": "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Robots-Tag": "noindex, nofollow",
}
OFF = (
    "The incident page is off on this bot: set [web] link_secret (RULELOOP_WEB_SECRET, at "
    "least 32 characters) and restart it."
)
MAX_ID = 2**63 - 1  # SQLite's and PostgreSQL's largest integer
MAX_ID_DIGITS = len(str(MAX_ID))
CHART_TYPES = {"svg": "image/svg+xml", "png": "image/png"}


class AdrReader(Protocol):
    """The bot's ADR store, as far as the page reads it."""

    def find(self, adr_id: str) -> tuple[Path, Adr] | None:
        """The record with this id and where it lives, or None."""
        ...


@functools.cache
def templates() -> jinja2.Environment:
    """The page templates (bot/templates/web/), autoescaped."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("bot", "templates/web"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


@functools.lru_cache(maxsize=32)
def _drawn(chart_json: str, fmt: Literal["png", "svg"]) -> bytes:
    """A chart drawn once per content and format (drawing costs about half a second of CPU)."""
    return render_chart(ChartData.from_json(json.loads(chart_json)), fmt=fmt)


class IncidentPages:
    """The read-only pages; ``links`` None: the page is off (no secret configured)."""

    def __init__(self, *, db: Database, links: PageLinks | None, adrs: AdrReader) -> None:
        self._db = db
        self._links = links
        self._adrs = adrs

    def routes(self) -> list[Route]:
        """The routes to mount on the bot's app."""
        return [
            Route("/incidents", self.index, methods=["GET"]),
            # the id is parsed here, not by Starlette's int convertor: 5,000 digits raised there
            Route("/incidents/{incident_id}", self.incident, methods=["GET"]),
            Route("/incidents/{incident_id}/chart.{fmt:str}", self.chart, methods=["GET"]),
            Route("/favicon.ico", _no_icon, methods=["GET"]),  # browsers ask; a 404 is logged
        ]

    async def index(self, request: Request) -> Response:
        """Every incident, newest first, each linked with a signature of its own."""
        refused = self._refused(request, INDEX)
        if refused is not None:
            return refused
        assert self._links is not None
        rows = await asyncio.to_thread(queries.recent, self._db)
        links = {r.id: self._links.incident_path(r.id) for r in rows}
        return _page("index.html.j2", incidents=index_rows(rows), links=links)

    async def incident(self, request: Request) -> Response:
        """One incident's page."""
        incident_id = _incident_id(request)
        if incident_id is None:
            return _no_such_incident(request)
        refused = self._refused(request, incident_subject(incident_id))
        if refused is not None:
            return refused
        record = await asyncio.to_thread(queries.incident, self._db, incident_id)
        if record is None:
            return _message(404, "No such incident",
                            f"There is no incident {incident_id} in this bot's store.")  # fmt: skip
        page = await asyncio.to_thread(incident_page, record, adr=self._adr, markdown=render)
        chart = f"/incidents/{incident_id}/chart.svg?{request.url.query}"
        return _page("incident.html.j2", page=page, chart_url=chart)

    async def chart(self, request: Request) -> Response:
        """The incident's chart, drawn from the diagnosis's chart data (SVG or PNG)."""
        incident_id = _incident_id(request)
        if incident_id is None:
            return _no_such_incident(request)
        refused = self._refused(request, incident_subject(incident_id))
        if refused is not None:
            return refused
        fmt = request.path_params["fmt"]
        if fmt not in CHART_TYPES:
            return _message(404, "No such chart", "Charts are chart.svg or chart.png.")
        summary = await asyncio.to_thread(queries.summary, self._db, incident_id)
        data = None if summary is None else summary.chart
        if not data:
            return _message(404, "No chart", f"Incident {incident_id} has no chart.")
        body = await asyncio.to_thread(_drawn, json.dumps(data, sort_keys=True), fmt)
        headers = {**HEADERS, "Cache-Control": "private, max-age=300"}
        return Response(body, media_type=CHART_TYPES[fmt], headers=headers)

    def _adr(self, adr_id: str) -> Adr | None:
        found = self._adrs.find(adr_id)
        return None if found is None else found[1]

    def _refused(self, request: Request, subject: str) -> Response | None:
        """The 403 (or 404: page off) answer for a link that does not open ``subject``."""
        if self._links is None:
            return _message(404, "Incident page off", OFF)
        params = request.query_params
        try:
            self._links.check(subject, exp=params.get("exp"), sig=params.get("sig"))
        except LinkRefused as refused:
            title = "Link expired" if refused.expired else "Link refused"
            return _message(403, title, str(refused))
        return None


def _incident_id(request: Request) -> int | None:
    """The path's incident id, or None when it is not one a store can hold (a signed 64-bit)."""
    text = request.path_params["incident_id"]
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_ID_DIGITS:
        return None
    number = int(text)
    return number if number <= MAX_ID else None


def _no_such_incident(request: Request) -> HTMLResponse:
    text = request.path_params["incident_id"]
    shown = text[:MAX_ID_DIGITS] + ("…" if len(text) > MAX_ID_DIGITS else "")
    why = f"'{shown}' is not an incident number; open the link the bot posted."
    return _message(404, "No such incident", why)


def _page(template: str, **context: Any) -> HTMLResponse:
    html = templates().get_template(template).render(**context)
    return HTMLResponse(html, headers={**HEADERS, "Cache-Control": "private, no-store"})


def _message(status: int, title: str, text: str) -> HTMLResponse:
    html = templates().get_template("message.html.j2").render(title=title, text=text)
    headers: Mapping[str, str] = {**HEADERS, "Cache-Control": "no-store"}
    return HTMLResponse(html, status_code=status, headers=dict(headers))


async def _no_icon(request: Request) -> Response:
    return Response(status_code=204, headers={"Cache-Control": "public, max-age=86400"})
