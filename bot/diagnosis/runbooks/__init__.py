"""Runbooks: YAML files that say which probes run for which alerts and what becomes a finding."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.diagnosis.runbooks.builtin import default_registry as default_registry
    from bot.diagnosis.runbooks.loader import LoadedRunbook as LoadedRunbook
    from bot.diagnosis.runbooks.loader import RunbookSet as RunbookSet
    from bot.diagnosis.runbooks.loader import inspect_file as inspect_file
    from bot.diagnosis.runbooks.loader import load_dir as load_dir
    from bot.diagnosis.runbooks.runner import RunbookRunner as RunbookRunner

__all__ = [
    "LoadedRunbook",
    "RunbookRunner",
    "RunbookSet",
    "default_registry",
    "inspect_file",
    "load_dir",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
