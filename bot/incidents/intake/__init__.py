"""Alertmanager intake: the webhook's payload model and the deduplicating incident service."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.incidents.intake.models import parse_webhook as parse_webhook
    from bot.incidents.intake.service import Intake as Intake
    from bot.incidents.intake.service import IntakeOutcome as IntakeOutcome

__all__ = [
    "Intake",
    "IntakeOutcome",
    "parse_webhook",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
