"""What the listeners act through: one typed object, so a slash command can be followed to its
service (by people and by mypy) and the services never import slack_bolt."""

from __future__ import annotations

from dataclasses import dataclass

from slack_bolt.context.async_context import AsyncBoltContext

from bot.incidents import IncidentFlows
from bot.kernel.runtime import TaskSupervisor
from bot.postmortem import DraftService
from bot.remediation import RemediationService, ThreadButtons
from bot.tune import Retune

KEY = "ruleloop_services"  # the request context key the app's middleware sets


@dataclass(frozen=True)
class Services:
    """The bot's services, as the Slack listeners see them."""

    flows: IncidentFlows
    remediation: RemediationService
    drafts: DraftService
    thread: ThreadButtons  # an incident thread's Silence / Acknowledge
    tasks: TaskSupervisor  # where deferred work runs: supervised, drained when the bot stops
    retune: Retune  # a drift thread's re-tune (its button is one of the thread's)


def services_of(context: AsyncBoltContext) -> Services:
    """The services the app was built with (every request's context carries them)."""
    found = context.get(KEY)
    if not isinstance(found, Services):
        raise RuntimeError(
            "the Slack app was built without its services (bot.surfaces.slack.app.build_app)"
        )
    return found
