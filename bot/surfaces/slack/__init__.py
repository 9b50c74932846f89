"""The Slack surface: bolt app, listeners, Block Kit views, the Slack or console notifier, and
the one boundary where a Slack error is judged (failures.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.surfaces.slack.app import build_app as build_app
    from bot.surfaces.slack.app import web_client as web_client
    from bot.surfaces.slack.console import ConsoleNotifier as ConsoleNotifier
    from bot.surfaces.slack.notifier import SlackNotifier as SlackNotifier
    from bot.surfaces.slack.replay import ReplayGuard as ReplayGuard
    from bot.surfaces.slack.replay import Seen as Seen
    from bot.surfaces.slack.services import Services as Services
    from bot.surfaces.slack.usergroups import SlackUserGroups as SlackUserGroups

__all__ = [
    "ConsoleNotifier",
    "ReplayGuard",
    "Seen",
    "Services",
    "SlackNotifier",
    "SlackUserGroups",
    "build_app",
    "shapes",
    "web_client",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
