"""Reading and rewriting the tunable vLLM flags inside a command line (a list, never a string).

Only allowlisted flags (``bot.adr.flags.TUNABLE``) are read or written; every other argument
(the model, the port, flags the ADRs do not govern) passes through untouched and in order.

A command line may carry secrets (``--api-key sk-...``), and what the flow records ends in the
append-only audit log. So a command line is recorded as ``record(argv)``: the tunable flags in
place, every other argument as a blank, and a hash of the whole; ``restore`` fills the blanks
from the command line running now and checks the hash.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from bot.adr import TUNABLE, EngineArgs, canonical, to_argv

FlagValues = dict[str, bool | int | float | str]


def _spec_of(token: str) -> tuple[str, bool, str | None] | None:
    """For '--flag', '--no-flag' or '--flag=v': (canonical name, negated, inline value)."""
    if not token.startswith("--"):
        return None
    name, eq, inline = token[2:].partition("=")
    name = canonical(name)
    if name.startswith("no-") and name[3:] in TUNABLE and TUNABLE[name[3:]].kind == "bool":
        return name[3:], True, None
    if name in TUNABLE:
        return name, False, inline if eq else None
    return None


def _convert(name: str, raw: str) -> bool | int | float | str:
    kind = TUNABLE[name].kind
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        return raw
    if kind == "bool":
        return raw.lower() in ("1", "true", "yes")
    return raw


def read_flags(argv: Sequence[str]) -> FlagValues:
    """The tunable flags set in ``argv`` (the last occurrence wins, as with argparse)."""
    flags: FlagValues = {}
    i = 0
    while i < len(argv):
        found = _spec_of(argv[i])
        if found is None:
            i += 1
            continue
        name, negated, inline = found
        if TUNABLE[name].kind == "bool":
            flags[name] = not negated if inline is None else _convert(name, inline)
            i += 1
        elif inline is not None:
            flags[name] = _convert(name, inline)
            i += 1
        else:
            if i + 1 < len(argv):
                flags[name] = _convert(name, argv[i + 1])
            i += 2
    return flags


def _marked(argv: Sequence[str], names: set[str]) -> list[tuple[str, bool]]:
    """Each token of ``argv``, and whether it is one of the named tunable flags or its value."""
    out: list[tuple[str, bool]] = []
    i = 0
    while i < len(argv):
        found = _spec_of(argv[i])
        if found is None or found[0] not in names:
            out.append((argv[i], False))
            i += 1
            continue
        name, _, inline = found
        takes_value = (
            TUNABLE[name].kind != "bool" and inline is None and not argv[i].startswith("--no-")
        )
        width = 2 if takes_value else 1
        out.extend((token, True) for token in argv[i : i + width])
        i += width
    return out


def without_flags(argv: Sequence[str], names: set[str]) -> list[str]:
    """``argv`` with every occurrence of the named tunable flags (and their values) removed."""
    return [token for token, flag in _marked(argv, names) if not flag]


def with_flags(argv: Sequence[str], flags: EngineArgs) -> list[str]:
    """``argv`` with ``flags`` set: old occurrences removed, the new ones appended at the end."""
    names = {canonical(k) for k in flags}
    return [*without_flags(argv, names), *to_argv(flags)]


def merge(current: Mapping[str, object], change: EngineArgs) -> FlagValues:
    """The flags after applying ``change`` on top of ``current`` (canonical names)."""
    merged: FlagValues = {canonical(k): v for k, v in current.items()}  # type: ignore[misc]
    merged.update({canonical(k): v for k, v in change.items()})
    return merged


def diff(
    before: Mapping[str, object], after: Mapping[str, object]
) -> list[tuple[str, object, object]]:
    """(flag, old, new) for every flag whose value changes; None means 'not set'."""
    names = sorted(set(before) | set(after))
    return [(n, before.get(n), after.get(n)) for n in names if before.get(n) != after.get(n)]


def other_args(argv: Sequence[str]) -> list[str]:
    """The arguments of ``argv`` that are not tunable flags (nor their values), in order."""
    return without_flags(argv, set(TUNABLE))


def fingerprint(argv: Sequence[str]) -> str:
    """'sha256:<hex>' of a whole command line: whether it changed, never what it holds."""
    return "sha256:" + hashlib.sha256(json.dumps(list(argv)).encode()).hexdigest()


def record(argv: Sequence[str]) -> dict[str, Any]:
    """What may be kept of ``argv``: its shape (tunable flags in place, other arguments as
    None) and its fingerprint."""
    shape = [token if flag else None for token, flag in _marked(argv, set(TUNABLE))]
    return {"shape": shape, "sha256": fingerprint(argv)}


def recorded_flags(kept: Mapping[str, Any]) -> FlagValues:
    """The tunable flags of a recorded command line."""
    return read_flags([token for token in kept["shape"] if token is not None])


def restore(kept: Mapping[str, Any], running: Sequence[str]) -> tuple[list[str], bool]:
    """The recorded command line, its blanks filled with ``running``'s other arguments, and
    True; when those are not the recorded ones (its fingerprint differs), ``running`` with the
    recorded tunable flags put back, and False."""
    others = other_args(running)
    shape = kept["shape"]
    if sum(token is None for token in shape) == len(others):
        filled = iter(others)
        argv = [next(filled) if token is None else token for token in shape]
        if fingerprint(argv) == kept["sha256"]:
            return argv, True
    return with_flags(others, recorded_flags(kept)), False


def flags_text(
    flags: Mapping[str, Any], *, none: str = "no tunable flags", ordered: bool = True
) -> str:
    """``--a=1 --b=2`` for messages (sorted unless ``ordered`` is False); ``none`` when empty."""
    items = sorted(flags.items()) if ordered else flags.items()
    return " ".join(f"--{k}={v}" for k, v in items) or none
