"""What goes wrong with a change made through git, as messages a person can act on."""

from __future__ import annotations

from bot.kernel import RuleloopError


class GitOpsError(RuleloopError):
    """A git command, the forge's API or a file in the repository did not do what was needed."""


class GitConflict(GitOpsError):
    """Someone else changed the same thing first (the file, the branch, the pull request):
    nothing of this change was left behind, and it may be asked for again."""
