"""The incident page: a read-only web view of each incident, served by `ruleloop serve`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.surfaces.web.links import PageLinks as PageLinks
    from bot.surfaces.web.links import page_links as page_links
    from bot.surfaces.web.routes import IncidentPages as IncidentPages

__all__ = [
    "IncidentPages",
    "PageLinks",
    "page_links",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
