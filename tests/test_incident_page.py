"""The incident page over HTTP (the bot's own ASGI app): what it shows of a whole incident, its
signed links (a forged, foreign, missing or expired one is a 403 that says which), the page
being off without a secret, and the links Slack messages carry.

The incident is real: diagnosed from recorded vLLM pages, fixed through /apply-adr with the
Kubernetes actuator (the fake cluster at the wire), judged by the real canary judge, drafted.
The browser test of the same page is test_incident_page_browser.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from click.testing import CliRunner

from bot.app.cli import cli
from bot.canary.schema import CanaryReport
from bot.kernel.config import Settings
from bot.kernel.errors import UsageError
from bot.kernel.store.summary import DiagnosisSummary
from bot.surfaces.web.view import BAD, GOOD, NEUTRAL, _numbers, four_number
from tests.fakes.incident_story import ADR, PUBLIC_URL, SECRET, Story, incident_story
from tests.fakes.slack_api import FakeSlack

LINK = re.compile(r"<(https://ruleloop\.example\.com/incidents/\d+\?[^|>]+)\|incident page>")


@pytest.fixture
async def story(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[Story]:
    async with incident_story(tmp_path, slack) as told:
        yield told


def slack_link(slack: FakeSlack) -> str:
    """The page link of the incident's root message, as the browser opens it."""
    root = slack.of("chat.postMessage")[0]
    found = LINK.search(json.dumps(root.args["blocks"]))
    assert found, root.args["blocks"]
    return found[1].replace("&amp;", "&")  # mrkdwn escapes the query's &


def path_of(url: str) -> str:
    return url.removeprefix(PUBLIC_URL)


def text_of(html: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)<', html, re.S)
    assert found, element_id
    return found[1].strip()


async def test_the_page_shows_the_whole_incident(story: Story) -> None:
    response = await story.h.client.get(path_of(slack_link(story.slack)))
    assert response.status_code == 200
    html = response.text
    summary = story.summary()
    # the four numbers: the incident as diagnosed, after the fix as the kept change's canary
    for key, label in (("ttft_p99_ms", "TTFT p99"), ("tpot_p99_ms", "TPOT p99")):
        shown = re.search(rf'data-number="{label}">([^<]+)<', html)
        assert shown and shown[1] == four_number(key, summary["headline"][key])
    after = dict(re.findall(r'data-after="([^"]+)">([^<]+)<', html))
    assert after == {"TTFT p99": "180 ms", "TPOT p99": "21.5 ms", "Goodput": "99.0 %",
                     "KV fragmentation": "12.0 %"}  # fmt: skip
    assert "≤ 350 ms" in html and "≥ 95.0 %" in html  # the seed ADR's gates
    for seen in (
        f"{ADR}: ",  # the matched ADR
        "applied: the canary met every gate",  # the remediation card
        "--max-num-batched-tokens: 8192 → 2048",  # what it changed
        ">passed<",  # the canary run's verdict
        "ADR-20261129-01",  # the draft, with its Markdown
        "alert received: incident opened",  # the timeline, from the audit log
        f"/apply-adr {ADR}: approved, starting",
        "TTFT p99 2472 ms",  # a finding
        '<img src="/incidents/1/chart.svg?',
    ):
        assert seen in html, seen
    assert "id: ADR-20261129-01" in html  # the draft's own text
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script" not in policy
    assert response.headers["referrer-policy"] == "no-referrer"
    assert "<script" not in html


def test_the_kept_canary_is_coloured_by_the_gates_that_judged_it_not_the_incidents() -> None:
    """The canary measures at its client under its own workload: another ADR's engine-side gate
    does not make it red next to 'kept: the canary met every gate'; its own failed gate does."""
    summary = DiagnosisSummary.of(
        {
            "headline": {"ttft_p99_ms": 2400.0, "tpot_p99_ms": 90.0},
            "baseline": {"ttft_p99_ms": [350.0, "ADR-OTHER"], "tpot_p99_ms": [50.0, "ADR-OTHER"]},
        }
    )
    kept = CanaryReport.of(
        {
            "ttft_ms": {"p99": 500.0},
            "tpot_ms": {"p99": 40.0},
            "goodput_ratio": 0.7,
            "gates": [
                {"name": "max_tpot_p99_ms", "limit": 50, "passed": True, "reason": "40 <= 50"},
                {"name": "min_goodput_ratio", "limit": 0.9, "passed": False, "reason": "0.7"},
            ],
        }
    )
    rows = {row.label: row for row in _numbers(summary, kept)}
    assert rows["TTFT p99"].incident_tone == BAD  # the incident against the strictest gate
    assert rows["TTFT p99"].after == "500 ms" and rows["TTFT p99"].after_tone == NEUTRAL
    assert rows["TPOT p99"].after_tone == GOOD
    assert rows["Goodput"].after_tone == BAD
    assert {row.after for row in _numbers(summary, None)} == {""}


def test_a_change_says_how_sure_its_verdict_was_and_what_no_gate_watched() -> None:
    """The page's change card carries the statistics and the guardrails the change recorded
    (incident.html.j2 shows each as a line); a change without them has neither."""
    import datetime as dt

    from bot.surfaces.web.queries import RemediationRow
    from bot.surfaces.web.view import _remediation

    sure = "TPOT p99: met at 99% (p=0.00047; n=8, 8 before)"
    worse = "TTFT p99 187ms → 420ms (2.2x): worse beyond 20% <and> noise"
    at = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)

    def row(result: dict[str, object]) -> RemediationRow:
        return RemediationRow(
            id=1, adr_id=ADR, target="prod-a", state="promoted", requested_by="U1",
            approved_by=["U2"], change={}, before={}, after={}, result=result, created_at=at,
            updated_at=at,
        )  # fmt: skip

    card = _remediation(row({"how_sure": [sure], "watched": [worse]}))
    assert (card.how_sure, card.watched) == ([sure], [worse])
    plain = _remediation(row({}))
    assert (plain.how_sure, plain.watched) == ([], [])


async def test_the_chart_is_served_as_svg_and_png_from_the_diagnosis(story: Story) -> None:
    query = urlsplit(slack_link(story.slack)).query
    svg = await story.h.client.get(f"/incidents/1/chart.svg?{query}")
    assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml"
    assert b"<svg" in svg.content[:1000] and len(svg.content) > 10_000  # drawn, not empty
    png = await story.h.client.get(f"/incidents/1/chart.png?{query}")
    assert png.headers["content-type"] == "image/png" and png.content[:8] == b"\x89PNG\r\n\x1a\n"
    other = await story.h.client.get(f"/incidents/1/chart.gif?{query}")
    assert other.status_code == 404


async def test_forged_foreign_missing_and_expired_links_are_refused_with_why(story: Story) -> None:
    url = slack_link(story.slack)
    path, query = path_of(url).split("?")
    params = {k: v[0] for k, v in parse_qs(query).items()}
    client = story.h.client
    forged = params["sig"][:-2] + ("AA" if not params["sig"].endswith("AA") else "BB")
    cases = {
        f"{path}?exp={params['exp']}&sig={forged}": "This link is not valid",
        f"{path}?exp={int(params['exp']) + 3600}&sig={params['sig']}": "This link is not valid",
        f"/incidents/2?{query}": "This link is not valid",  # incident 1's link, on incident 2
        f"/incidents?{query}": "This link is not valid",  # ... on the index
        path: "This page opens only from a signed link",
        f"{path}?exp=soon&sig={params['sig']}": "This link is damaged",
        f"/incidents/1/chart.svg?exp={params['exp']}&sig={forged}": "This link is not valid",
    }
    for target, why in cases.items():
        response = await client.get(target)
        assert response.status_code == 403, target
        assert text_of(response.text, "message").startswith(why), target
        assert "2,472" not in response.text  # nothing of the incident leaks
    story.wall.now = int(params["exp"]) + 1  # the link's time is up
    expired = await client.get(f"{path}?{query}")
    assert expired.status_code == 403
    assert text_of(expired.text, "message-title") == "Link expired"
    assert "fresh one each time it is updated" in expired.text


async def test_page_link_prints_an_index_link_whose_entries_open_their_pages(
    story: Story,
) -> None:
    env = {"RULELOOP_WEB_SECRET": SECRET, "RULELOOP_PUBLIC_URL": PUBLIC_URL}
    printed = CliRunner().invoke(cli, ["page-link"], env=env)
    assert printed.exit_code == 0, printed.output
    index = await story.h.client.get(path_of(printed.output.strip()))
    assert index.status_code == 200
    (link,) = re.findall(r'<a href="(/incidents/1\?[^"]+)"', index.text)
    opened = await story.h.client.get(link.replace("&amp;", "&"))
    assert opened.status_code == 200 and "#1 VLLMTimeToFirstTokenP99High" in opened.text


async def test_slack_messages_link_the_page_and_the_link_opens_it(story: Story) -> None:
    findings = next(
        c for c in story.slack.of("chat.postMessage") if " finding(s) on " in c.args["text"]
    )
    found = LINK.search(json.dumps(findings.args["blocks"]))
    assert found, "the diagnosis's findings message carries the page link"
    page = await story.h.client.get(path_of(found[1].replace("&amp;", "&")))
    assert page.status_code == 200


async def test_without_a_public_url_no_message_links_and_without_a_secret_no_page(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async with incident_story(tmp_path, slack, web={"link_secret": SECRET},
                              remediate=False) as story:  # fmt: skip
        posted = json.dumps([c.args for c in slack.of("chat.postMessage")])
        assert "incident page>" not in posted
    (tmp_path / "off").mkdir()
    async with incident_story(tmp_path / "off", slack, web={}, remediate=False) as story:
        off = await story.h.client.get("/incidents/1?exp=1&sig=x")
        assert off.status_code == 404
        assert "The incident page is off on this bot" in text_of(off.text, "message")


def test_a_public_url_without_a_secret_or_a_short_secret_is_refused() -> None:
    with pytest.raises(UsageError, match="public_url is set but link_secret is not"):
        Settings.load({"RULELOOP_PUBLIC_URL": PUBLIC_URL})
    with pytest.raises(UsageError, match="at least 32 characters"):
        Settings.load({"RULELOOP_WEB_SECRET": "short"})
    with pytest.raises(UsageError, match="not a base URL"):
        Settings.load(
            {"RULELOOP_PUBLIC_URL": "ruleloop.example.com", "RULELOOP_WEB_SECRET": SECRET}
        )
    web = Settings.load({"RULELOOP_PUBLIC_URL": PUBLIC_URL + "/", "RULELOOP_WEB_SECRET": SECRET})
    assert web.web.public_url == PUBLIC_URL


def test_page_link_without_a_secret_says_what_to_set() -> None:
    printed = CliRunner().invoke(cli, ["page-link", "1"], env={"RULELOOP_WEB_SECRET": ""})
    assert printed.exit_code == 2
    assert "no [web] link_secret: set RULELOOP_WEB_SECRET" in printed.output


@pytest.mark.parametrize("number", ["9" * 5000, "99999999999999999999", "٣", "12a"])
def test_an_incident_number_no_store_holds_is_a_404_not_a_500(number: str) -> None:
    # 5,000 digits raised in Starlette's int convertor (a 500 with a traceback, no link needed)
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from bot.surfaces.web.links import PageLinks
    from bot.surfaces.web.routes import IncidentPages

    links = PageLinks(secret=SECRET.encode(), ttl_s=60, clock=lambda: 0.0)
    pages = IncidentPages(db=None, links=links, adrs=None)  # type: ignore[arg-type]
    client = TestClient(Starlette(routes=pages.routes()), raise_server_exceptions=False)
    for path in (f"/incidents/{number}", f"/incidents/{number}/chart.svg"):
        response = client.get(path)
        assert response.status_code == 404, path
        assert "is not an incident number" in response.text
        assert len(response.text) < 5000
