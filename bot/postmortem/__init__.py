"""The post-incident ADR: drafted from what an incident measured and did, then reviewed.

draft.py   plain facts of an incident (alert, diagnosis, canary runs, the fix applied) -> a
           proposed ADR in the seed's template
review.py  who may review a draft; the record accepting or rejecting it makes
"""

from bot.postmortem.draft import AppliedFix, CanaryFacts, IncidentFacts, build_postmortem
from bot.postmortem.review import accept_draft, check_reviewer, reject_draft

__all__ = [
    "AppliedFix",
    "CanaryFacts",
    "IncidentFacts",
    "accept_draft",
    "build_postmortem",
    "check_reviewer",
    "reject_draft",
]
