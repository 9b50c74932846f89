"""A package's face: the names other rooms may import from it, each loaded on first use.

A package lists what other rooms may import from it once, as imports under ``if
TYPE_CHECKING:`` in its ``__init__`` (what mypy reads) and in ``__all__``; at run time
``__getattr__ = face_of(__name__, __file__)`` loads a name's module when the name is first
asked for (PEP 562). Importing a package so costs nothing until a name is used: ``ruleloop
--help`` and the gateway load no more than before. Other rooms import the package, never a
module inside it; the import contracts ("... has a face", pyproject.toml) fail on one that does.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any


def names_of(init_file: str | Path) -> dict[str, tuple[str, str]]:
    """A face's names: name -> (module, its name there), read from the ``__init__``'s
    ``if TYPE_CHECKING:`` imports."""
    tree = ast.parse(Path(init_file).read_text("utf-8"))
    table = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            continue
        for imported in node.body:
            if isinstance(imported, ast.ImportFrom) and imported.module:
                for alias in imported.names:
                    table[alias.asname or alias.name] = (imported.module, alias.name)
    return table


def face_of(package: str, init_file: str) -> Callable[[str], Any]:
    """The package's module ``__getattr__``: a name of its face, read from its module each
    time it is imported (not kept on the package: a name its module rebinds, as a test's
    monkeypatch does, is the new one); AttributeError for any other name."""
    table: dict[str, tuple[str, str]] = {}

    def __getattr__(name: str) -> Any:
        if not table:
            table.update(names_of(init_file))
        found = table.get(name)
        if found is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = found
        return getattr(importlib.import_module(module), attribute)

    return __getattr__
