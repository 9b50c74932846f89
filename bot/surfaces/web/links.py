"""Signed links to the incident page: HMAC-SHA256 over what the link opens and until when.

A link carries ``exp`` (unix seconds) and ``sig``; the signature covers the subject (one
incident, or the index) and the expiry, so a link for incident 7 opens nothing else and cannot
be stretched. Checked in constant time. The secret is ``[web] link_secret``; changing it
revokes every link given out.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

from bot.kernel import WebSettings

INDEX = "index"


class LinkRefused(Exception):
    """Why a link does not open its page, in words for the person holding it."""

    def __init__(self, reason: str, *, expired: bool = False) -> None:
        super().__init__(reason)
        self.expired = expired


def incident_subject(incident_id: int) -> str:
    """What an incident's link is signed for."""
    return f"incident:{incident_id}"


@dataclass(frozen=True)
class PageLinks:
    """Signs and checks page links with one secret; ``base_url`` set: absolute links."""

    secret: bytes
    ttl_s: float
    clock: Callable[[], float]
    base_url: str | None = None

    def sign(self, subject: str, expires: int) -> str:
        """The signature of ``subject`` until ``expires`` (URL-safe base64, no padding)."""
        message = f"ruleloop-page-v1\n{subject}\n{expires}".encode()
        digest = hmac.new(self.secret, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def query(self, subject: str, *, expires: int | None = None) -> str:
        """``exp=...&sig=...`` for ``subject``, valid for the TTL from now unless told."""
        exp = expires if expires is not None else math.ceil(self.clock() + self.ttl_s)
        return urlencode({"exp": exp, "sig": self.sign(subject, exp)})

    def incident_path(self, incident_id: int, *, expires: int | None = None) -> str:
        """The incident page's path and signed query."""
        return f"/incidents/{incident_id}?" + self.query(
            incident_subject(incident_id), expires=expires
        )

    def incident_url(self, incident_id: int, *, expires: int | None = None) -> str:
        """The incident page's link (absolute when a public URL is configured)."""
        return f"{self.base_url or ''}{self.incident_path(incident_id, expires=expires)}"

    def index_url(self, *, expires: int | None = None) -> str:
        """The index's link (absolute when a public URL is configured)."""
        return f"{self.base_url or ''}/incidents?" + self.query(INDEX, expires=expires)

    def check(self, subject: str, *, exp: str | None, sig: str | None) -> int:
        """The link's expiry when it opens ``subject`` now; LinkRefused saying why not."""
        if not exp or not sig:
            raise LinkRefused(
                "This page opens only from a signed link: use the link in the incident's Slack "
                "thread, or ask for one with `ruleloop page-link`."
            )
        try:
            expires = int(exp)
        except ValueError:
            raise LinkRefused("This link is damaged (its expiry is not a number).") from None
        if not hmac.compare_digest(self.sign(subject, expires).encode(), sig.encode()):
            raise LinkRefused(
                "This link is not valid: it was changed, is for another page, or was signed "
                "with a secret this bot no longer uses."
            )
        if expires <= self.clock():
            raise LinkRefused(
                "This link has expired. The incident's root message in Slack carries a fresh "
                "one each time it is updated; `ruleloop page-link` makes a new one.",
                expired=True,
            )
        return expires


def page_links(settings: WebSettings, *, clock: Callable[[], float]) -> PageLinks | None:
    """The configured links (None: no secret, so no page is served)."""
    if settings.link_secret is None:
        return None
    return PageLinks(
        secret=settings.link_secret.get_secret_value().encode(),
        ttl_s=settings.link_ttl_s,
        clock=clock,
        base_url=settings.public_url,
    )
