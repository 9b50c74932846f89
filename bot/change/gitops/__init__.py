"""Changes that land as commits in a team's git repository, reviewed where the team reviews.

    git.py          the `git` CLI (clone, fetch, commit, revert, push), credentials kept out
                    of argv and every message
    trailers.py     commit messages with trailers (Ruleloop-Change, Ruleloop-Revert-Of, ...)
                    so a restarted bot finds its own commits
    forge.py        GitHub and GitLab REST: open, find, merge and close a pull request
    landing.py      one commit onto the target branch: a pull request merged, or a direct push;
                    a refused one leaves no branch or pull request behind
    adr_publish.py  an accepted ADR as a pull request into the team's adr/ directory
    secrets.py      tokens read from mounted files; ``scrub`` for every text shown
    errors.py       GitOpsError, and Conflict: someone else was first, nothing left behind

The remediation's git actuator (bot/change/actuators/git.py, with the flags' locator in
bot/change/actuators/yaml_flags.py) and the ADR publisher are built from these parts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.change.gitops.adr_publish import publish_accepted as publish_accepted

__all__ = [
    "publish_accepted",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
