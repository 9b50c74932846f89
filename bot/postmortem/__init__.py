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

from bot.postmortem.draft import AppliedFix, CanaryFacts, IncidentFacts, build_postmortem
from bot.postmortem.review import check_reviewer

__all__ = [
    "AppliedFix",
    "CanaryFacts",
    "IncidentFacts",
    "build_postmortem",
    "check_reviewer",
]
