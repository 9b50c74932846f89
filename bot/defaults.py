"""The runbooks and seed ADR shipped inside the package, for a bot started outside the checkout.

`ruleloop serve` reads `runbooks/` and `adr/` relative to where it starts; installed from a
wheel and started anywhere else, it stopped with "runbook directory runbooks does not exist".
When ``[paths] runbooks`` is not set and there is no such directory, the packaged copies of the
repository's runbooks (``bot/shipped/runbooks``) are used. When ``[paths] adr`` is not set and
there is no ``adr/`` either, the decision store lives in the state directory (it must be
writable: drafts are written there), seeded once with the packaged seed ADR. A directory that
is configured is used as it is: a missing one is still an error that names it.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from bot.config import Settings

log = logging.getLogger("ruleloop.config")
SHIPPED = Path(__file__).parent / "shipped"
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
        adr = (paths.state or state_dir) / "adr"
        seed(adr)
    if (runbooks, adr) == (paths.runbooks, paths.adr):
        return settings
    resolved = paths.model_copy(update={"runbooks": runbooks, "adr": adr})
    return settings.model_copy(update={"paths": resolved})


def seed(adr_dir: Path) -> None:
    """Create ``adr_dir`` with the shipped seed ADR, unless it exists (its ADRs are kept)."""
    if adr_dir.exists():
        return
    adr_dir.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(SEED_ADRS, adr_dir)
    log.info("no adr/ here and no [paths] adr: the decision store is %s (seeded)", adr_dir)
