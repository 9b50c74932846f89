"""Fuzz the incident page's routes (bot/surfaces/web/routes.py) over HTTP: any path under
/incidents, any query, links signed right for the wrong subject or time, or not at all. Every
answer is a page that says why (200, 403, 404), never a 5xx or a traceback, and nothing of the
store shows without a valid link. The store is a real SQLite database, one incident in it."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from urllib.parse import quote, urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.testclient import TestClient

from bot.kernel.store.db import Database
from bot.kernel.store.models import Incident
from bot.surfaces.web.links import INDEX, PageLinks, incident_subject
from bot.surfaces.web.routes import IncidentPages
from tests.fuzzing import examples

pytestmark = pytest.mark.faults

FUZZ = settings(
    max_examples=examples(1_000), deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip
NOW = 1_800_000_000.0
SECRET = b"a-secret-long-enough-for-the-page-links"
MARK = "FUZZ-INCIDENT-TITLE-7f3a"  # the stored incident's title: shows only behind a good link
LINKS = PageLinks(secret=SECRET, ttl_s=3600, clock=lambda: NOW)


class Refusals(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, PageLinks]]:
    db = Database(f"sqlite:///{tmp_path_factory.mktemp('page-fuzz') / 'ruleloop.db'}")
    db.create_schema()
    with db.transaction() as s:
        s.add(Incident(key="fuzz", source="slash", status="firing", title=MARK, target="prod-a",
                       labels={}, opened_at=dt.datetime(2026, 12, 5, tzinfo=dt.UTC)))  # fmt: skip
    pages = IncidentPages(db=db, links=LINKS, adrs=None)  # type: ignore[arg-type]
    with TestClient(Starlette(routes=pages.routes()), raise_server_exceptions=False) as client:
        yield client, LINKS
    db.dispose()


IDS = (
    st.integers(-5, 5).map(str) | st.sampled_from(["1", "01", "9" * 400, "٣", "1e3", "", "%00"])
    | st.text(max_size=8).map(lambda t: quote(t, safe=""))
)  # fmt: skip
SUBJECTS = st.sampled_from([INDEX, incident_subject(1), incident_subject(2), "x", ""])
EXP = st.integers(0, 2 * int(NOW)) | st.just(int(NOW) + 60) | st.sampled_from(["soon", "", "-1"])


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bool]:
    """A path under /incidents and a query; True when the link is good for that path."""
    kind = draw(st.sampled_from(["index", "incident", "chart", "junk"]))
    number = draw(IDS)
    path = {"index": "/incidents", "incident": f"/incidents/{number}",
            "chart": f"/incidents/{number}/chart.{draw(st.sampled_from(['svg', 'png', 'x', '']))}",
            "junk": "/incidents/" + quote(draw(st.text(max_size=12)), safe="/.")}[kind]  # fmt: skip
    subject, exp = draw(SUBJECTS), draw(EXP)
    signed = isinstance(exp, int) and draw(st.booleans())
    sig = LINKS.sign(subject, exp) if signed else draw(st.text(max_size=20))
    params = draw(st.sampled_from([{"exp": exp, "sig": sig}, {"sig": sig}, {"exp": exp}, {}]))
    encoded = draw(st.booleans())
    query = urlencode(params) if encoded else quote(draw(st.text(max_size=30)), safe="=&")
    good = (
        encoded and signed and "exp" in params and "sig" in params and exp > NOW
        and ((kind == "index" and subject == INDEX)
             or (kind == "incident" and number == "1" and subject == incident_subject(1)))
    )  # fmt: skip
    return f"{path}?{query}", bool(good)


@FUZZ
@given(request=requests())
def test_every_page_request_is_an_answer_that_says_why(
    page: tuple[TestClient, PageLinks], request: tuple[str, bool]
) -> None:
    client, _ = page
    url, good = request
    caught = Refusals()
    logging.getLogger().addHandler(caught)
    try:
        response = client.get(url)
    finally:
        logging.getLogger().removeHandler(caught)
    assert response.status_code in (200, 403, 404), (url, response.status_code)
    assert [r.getMessage() for r in caught.records if r.exc_info] == [], url
    if response.status_code != 200:
        assert MARK not in response.text, url  # nothing of the store without a good link
    if good:
        assert response.status_code == 200 and ("incident" in url or MARK in response.text), url


def test_a_good_link_opens_the_stored_incident(page: tuple[TestClient, PageLinks]) -> None:
    """The fuzz's bad cases are not vacuous: the same client opens the page with a good link."""
    client, links = page
    response = client.get(links.incident_path(1))
    assert response.status_code == 200 and MARK in response.text
