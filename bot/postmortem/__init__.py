"""The post-incident ADR: drafted from what an incident measured and did, then reviewed.

draft.py   plain facts of an incident (alert, diagnosis, canary runs, the fix applied) -> a
           proposed ADR in the seed's template
review.py  who may review a draft; the record accepting or rejecting it makes
ports.py   what a posted draft shows (DraftView) and the role that posts it (DraftNotifier)
records.py the store work, each one transaction: the facts a draft is written from, the draft
           with its review buttons, the decision of a review (DraftRecords)
service.py the flow: /adr-draft and the draft a remediation ends with, posted in the thread;
           the review buttons (DraftService)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.postmortem.draft import AppliedFix as AppliedFix
    from bot.postmortem.draft import CanaryFacts as CanaryFacts
    from bot.postmortem.draft import IncidentFacts as IncidentFacts
    from bot.postmortem.draft import build_postmortem as build_postmortem
    from bot.postmortem.ports import DraftNotifier as DraftNotifier
    from bot.postmortem.ports import DraftView as DraftView
    from bot.postmortem.review import check_reviewer as check_reviewer
    from bot.postmortem.service import DraftService as DraftService

__all__ = [
    "AppliedFix",
    "CanaryFacts",
    "DraftNotifier",
    "DraftService",
    "DraftView",
    "IncidentFacts",
    "build_postmortem",
    "check_reviewer",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
