"""The incident page in a real browser: Debian's chromium, driven by Playwright.

The bot's app is served over HTTP (uvicorn) with a whole incident in its store (see
tests/fakes/incident_story.py); the browser opens the link the Slack message carries, on a
desktop and a phone-sized window. The numbers must be the diagnosis's, the chart must load
(an image with a width), nothing may be logged to the console, and the page must fit a phone's
width. A forged link and an expired one get the 403 page.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvicorn
from playwright.async_api import Browser, ConsoleMessage, async_playwright

from bot.diagnosis.models import summary_numbers
from bot.kernel.store.summary import DiagnosisSummary
from bot.surfaces.web.view import four_number
from tests.fakes.incident_story import PUBLIC_URL, Story, incident_story
from tests.fakes.slack_api import FakeSlack
from tests.test_incident_page import slack_link

CHROMIUM = "/usr/bin/chromium"  # Debian's package (make system-deps); no `playwright install`
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
pytestmark = pytest.mark.slow


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: `make system-deps` installs chromium"
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


@pytest.fixture
async def served(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[tuple[Story, str]]:
    """The incident's bot, served on a free port: (the story, the page's base URL)."""
    async with incident_story(tmp_path, slack) as story:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(
            uvicorn.Config(story.h.bot.app, lifespan="off", log_level="warning")
        )
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                assert not task.done(), "uvicorn did not start"
                await asyncio.sleep(0.02)
            yield story, f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            await task
            sock.close()


async def test_the_page_renders_the_numbers_and_the_chart_without_console_errors(
    browser: Browser, served: tuple[Story, str]
) -> None:
    story, base = served
    link = slack_link(story.slack).replace(PUBLIC_URL, base)
    headline = summary_numbers(DiagnosisSummary.of(story.summary()))
    for viewport in ({"width": 1280, "height": 900}, {"width": 390, "height": 844}):
        page = await browser.new_page(viewport=viewport)  # type: ignore[arg-type]
        problems: list[str] = []

        def console(message: ConsoleMessage, problems: list[str] = problems) -> None:
            if message.type in ("error", "warning"):
                problems.append(f"{message.type}: {message.text}")

        page.on("console", console)
        page.on("pageerror", lambda error, problems=problems: problems.append(str(error)))
        response = await page.goto(link)
        assert response is not None and response.status == 200
        for key, label in (("ttft_p99_ms", "TTFT p99"), ("tpot_p99_ms", "TPOT p99"),
                           ("goodput_ratio", "Goodput"), ("kv_fragmentation", "KV fragmentation")):  # fmt: skip
            shown = await page.inner_text(f'[data-number="{label}"]')
            assert shown == four_number(key, headline.reading(key)), label
        chart = page.locator("#chart img")
        await chart.scroll_into_view_if_needed()
        loaded = await chart.evaluate("img => img.complete && img.naturalWidth")
        assert loaded and loaded > 0, "the chart did not load"
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= viewport["width"], f"the page is {width} px wide in {viewport}"
        assert problems == []
        await page.close()


async def test_a_forged_or_expired_link_gets_the_403_page(
    browser: Browser, served: tuple[Story, str]
) -> None:
    story, base = served
    link = slack_link(story.slack).replace(PUBLIC_URL, base)
    page = await browser.new_page()
    forged = await page.goto(link.replace("exp=", "exp=1"))
    assert forged is not None and forged.status == 403
    assert (await page.inner_text("#message")).startswith("This link is not valid")
    story.wall.now += 15 * 86400  # past the link's 14 days
    expired = await page.goto(link)
    assert expired is not None and expired.status == 403
    assert await page.inner_text("#message-title") == "Link expired"
    await page.close()
