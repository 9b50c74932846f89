"""The runbooks and seed ADR shipped inside the package, for a bot started outside the checkout.

`ruleloop serve` reads `runbooks/` and `adr/` relative to where it starts. When ``[paths]
runbooks`` is not set and there is no such directory, the packaged copies of the repository's
runbooks (``bot/shipped/runbooks``) are used. When ``[paths] adr`` is not set and there is no
``adr/`` either, the packaged seed ADR (``bot/shipped/adr``) is imported in place: the directory
is only read (drafts and decisions live in the store, bot.adr.shared), so it needs no writable
copy. A ``<state dir>/adr`` with ADRs in it is read instead, so that they reach the store. A
directory that is configured is used as it is: a missing one is an error that names it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from bot.kernel.config import Settings

log = logging.getLogger("ruleloop.config")
SHIPPED = Path(__file__).parents[2] / "shipped"
RUNBOOKS = SHIPPED / "runbooks"
SEED_ADRS = SHIPPED / "adr"


def with_defaults(settings: Settings, *, state_dir: Path) -> Settings:
    """``settings`` whose unset runbook and ADR directories exist (packaged ones as needed)."""
    paths = settings.paths
    given = paths.model_fields_set
    runbooks, adr = paths.runbooks, paths.adr
    if "runbooks" not in given and not runbooks.is_dir():
        runbooks = RUNBOOKS
        log.info("no runbooks/ here and no [paths] runbooks: using the shipped runbooks")
    if "adr" not in given and not adr.is_dir():
        earlier = (paths.state or state_dir) / "adr"  # seeded by versions that wrote ADR files
        adr = earlier if earlier.is_dir() else SEED_ADRS
        log.info("no adr/ here and no [paths] adr: importing the ADRs of %s", adr)
    if (runbooks, adr) == (paths.runbooks, paths.adr):
        return settings
    resolved = paths.model_copy(update={"runbooks": runbooks, "adr": adr})
    return settings.model_copy(update={"paths": resolved})
