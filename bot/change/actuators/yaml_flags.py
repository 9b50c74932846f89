"""The vLLM flags inside one YAML file of the deployment repository, read and edited in place.

A locator names the file and either the path to the container's args list (a kustomize patch,
a plain manifest, a Helm values file with an ``args:`` list) or the path to each flag's value
(Helm values such as ``vllm.maxNumBatchedTokens``). Paths are dotted keys, list indexes
``[0]`` and list items picked by a field ``[name=vllm]``:

    spec.template.spec.containers[name=vllm].args
    [0].value                                       (a JSON 6902 patch file)

Edits are minimal, because a person reviews the diff: ruamel.yaml round-trips the file
(comments, quoting and key order kept), the indentation that reproduces the file unchanged is
picked, and only the flags that change are touched where they stand: a value replaced in
place, a missing flag appended at the end of the list. Every other argument stays as it is.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.events import AliasEvent, CollectionEndEvent, CollectionStartEvent, NodeEvent
from ruamel.yaml.scalarstring import DoubleQuotedScalarString, ScalarString

from bot.adr import TUNABLE, canonical, to_argv
from bot.change.actuators.base import ActuatorError
from bot.change.argv import FlagValues, read_flags
from bot.kernel import AdrError, GitLocatorSpec

# (mapping, sequence, offset) styles people write; the one that reproduces the file is used
_INDENTS = ((2, 4, 2), (2, 2, 0), (4, 4, 2), (4, 6, 4), (4, 4, 0), (2, 2, 2))
# nodes a file may stand for once its aliases are expanded: a deployment file has a few
# hundred; ten nested aliases of ten stand for 10^10, and reading them took minutes
MAX_EXPANDED_NODES = 50_000
_SEGMENT = re.compile(r"\[(\d+)\]|\[([^=\]]+)=([^\]]*)\]|([^.\[\]]+)")


class LocatorError(ActuatorError):
    """The locator does not find the flags in the file (or the file is not YAML)."""


@dataclass(frozen=True)
class Step:
    """One segment of a path: a mapping key, a list index, or a list item picked by a field."""

    key: str | None = None
    index: int | None = None
    field: tuple[str, str] | None = None

    def __str__(self) -> str:
        if self.key is not None:
            return self.key
        if self.index is not None:
            return f"[{self.index}]"
        assert self.field is not None
        return f"[{self.field[0]}={self.field[1]}]"


def parse_path(path: str) -> list[Step]:
    """A locator path as steps; LocatorError when it is not one."""
    steps: list[Step] = []
    pos = 0
    while pos < len(path):
        if path[pos] == "." and steps:
            pos += 1
        match = _SEGMENT.match(path, pos)
        if match is None:
            raise LocatorError(
                f"{path!r} is not a locator path (dotted keys, [n], [key=value]), e.g. "
                "spec.template.spec.containers[name=vllm].args"
            )
        index, fkey, fvalue, key = match.groups()
        if index is not None:
            steps.append(Step(index=int(index)))
        elif fkey is not None:
            steps.append(Step(field=(fkey, fvalue)))
        else:
            steps.append(Step(key=key))
        pos = match.end()
    if not steps:
        raise LocatorError("an empty locator path finds nothing")
    return steps


@dataclass(frozen=True)
class Found:
    """What a locator reads in a file: the tunable flags, and the args list when it names one
    (it may hold other arguments' values: never recorded as is, see argv.record)."""

    flags: FlagValues
    args: list[str] | None


class Locator:
    """Reads and edits the flags that one locator names."""

    def __init__(self, spec: GitLocatorSpec) -> None:
        self.spec = spec
        self._args = parse_path(spec.args) if spec.args is not None else None
        self._flags: dict[str, list[Step]] = {}
        for name, path in spec.flags.items():
            if canonical(name) not in TUNABLE:
                raise LocatorError(
                    f"locator of {spec.file}: {name!r} is not a tunable flag; allowed: "
                    f"{', '.join(TUNABLE)}"
                )
            self._flags[canonical(name)] = parse_path(path)

    # --- reading ------------------------------------------------------------------------------

    def read(self, text: str) -> Found:
        """The flags the file sets where the locator points."""
        doc = self._document(_load(text, self.spec.file)[0])
        if self._args is not None:
            seq = self._seq(doc)
            args = [str(item) for item in seq]
            return Found(flags=read_flags(args), args=args)
        flags: FlagValues = {}
        for name, steps in self._flags.items():
            parent, last = self._parent(doc, steps, name, create=False)
            if parent is None:
                continue
            value = _get(parent, last)
            if value is not None:
                flags.update(read_flags([f"--{name}={_text(value)}"]))
        return Found(flags=flags, args=None)

    # --- writing ------------------------------------------------------------------------------

    def write(self, text: str, changes: FlagValues) -> str:
        """``text`` with ``changes`` set, everything else as it was."""
        try:
            to_argv(changes)  # refuses flags off the allowlist and bad values
        except AdrError as exc:
            raise LocatorError(f"cannot write these flags into {self.spec.file}: {exc}") from exc
        docs, indent = _load(text, self.spec.file)
        doc = self._document(docs)
        if self._args is not None:
            seq = self._seq(doc)
            for name, value in changes.items():
                _set_flag(seq, canonical(name), value)
        else:
            for name, value in changes.items():
                steps = self._flags.get(canonical(name))
                if steps is None:
                    raise LocatorError(
                        f"the locator of {self.spec.file} has no path for --{canonical(name)}: "
                        f'add `flags.{canonical(name)} = "<path of its value>"` to it'
                    )
                parent, last = self._parent(doc, steps, canonical(name), create=True)
                assert parent is not None
                _put(parent, last, value)
        return _dump(docs, indent, explicit_start=_explicit_start(text))

    # --- finding ------------------------------------------------------------------------------

    def _document(self, docs: list[Any]) -> Any:
        if self.spec.document >= len(docs):
            raise LocatorError(
                f"{self.spec.file} has {len(docs)} YAML document(s), the locator reads "
                f"document {self.spec.document} (counted from 0): fix `document`"
            )
        return docs[self.spec.document]

    def _seq(self, doc: Any) -> list[Any]:
        assert self._args is not None
        node = _walk(doc, self._args, self.spec.file, self.spec.args or "")
        if not isinstance(node, list):
            raise LocatorError(
                f"{self.spec.file}: {self.spec.args} is a {type(node).__name__}, not a list of "
                "arguments: point `args` at the container's args list"
            )
        return node

    def _parent(self, doc: Any, steps: list[Step], name: str, *, create: bool) -> tuple[Any, Step]:
        """The node holding a flag's value and the last step; (None, step) when the value is
        not there and ``create`` is False."""
        where = self.spec.flags.get(name) or next(
            v for k, v in self.spec.flags.items() if canonical(k) == name
        )
        *head, last = steps
        try:
            parent = _walk(doc, head, self.spec.file, where) if head else doc
        except LocatorError:
            if not create:
                return None, last
            raise
        if last.key is None and last.index is None:
            raise LocatorError(f"{self.spec.file}: {where} must end in a key or an index")
        return parent, last


def _walk(node: Any, steps: list[Step], file: str, path: str) -> Any:
    done: list[str] = []
    for step in steps:
        found: Any = None
        if step.key is not None and isinstance(node, dict):
            found = node.get(step.key)
            if found is None:
                keys = ", ".join(str(k) for k in node) or "none"
                raise LocatorError(
                    f"{file}: {'.'.join(done) or 'the document'} has no key {step.key!r} "
                    f"(its keys: {keys}); fix the locator path {path}"
                )
        elif step.index is not None and isinstance(node, list):
            if step.index >= len(node):
                raise LocatorError(
                    f"{file}: {'.'.join(done) or 'the document'} has {len(node)} items, the "
                    f"locator path {path} wants item {step.index}"
                )
            found = node[step.index]
        elif step.field is not None and isinstance(node, list):
            key, value = step.field
            found = next(
                (i for i in node if isinstance(i, dict) and str(i.get(key)) == value), None
            )
            if found is None:
                seen = ", ".join(str(i.get(key)) for i in node if isinstance(i, dict)) or "none"
                raise LocatorError(
                    f"{file}: {'.'.join(done) or 'the document'} has no item with "
                    f"{key}={value} (its {key}s: {seen}); fix the locator path {path}"
                )
        else:
            raise LocatorError(
                f"{file}: {'.'.join(done) or 'the document'} is a {type(node).__name__}, the "
                f"locator path {path} expects {'a mapping' if step.key else 'a list'} there"
            )
        node = found
        done.append(str(step))
    return node


def _get(parent: Any, step: Step) -> Any:
    if step.key is not None:
        return parent.get(step.key) if isinstance(parent, dict) else None
    if isinstance(parent, list) and step.index is not None and step.index < len(parent):
        return parent[step.index]
    return None


def _put(parent: Any, step: Step, value: bool | int | float | str) -> None:
    old = _get(parent, step)
    new: Any = value
    if isinstance(old, str) and not isinstance(value, bool):
        new = _like(old, str(value))  # a chart that takes strings keeps getting strings
    elif isinstance(old, str) and isinstance(value, bool):
        new = _like(old, "true" if value else "false")
    if step.key is not None:
        parent[step.key] = new
    else:
        assert step.index is not None
        parent[step.index] = new


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --- the args list, edited in place ----------------------------------------------------------


def _occurrences(seq: list[Any], name: str) -> list[tuple[int, int, bool]]:
    """(index, width, inline) of each occurrence of ``--name`` in an args list."""
    kind = TUNABLE[name].kind
    found = []
    i = 0
    while i < len(seq):
        token = str(seq[i])
        flag, eq, _ = token[2:].partition("=") if token.startswith("--") else ("", "", "")
        flag = canonical(flag)
        if flag == name or (kind == "bool" and flag == f"no-{name}"):
            width = 1 if eq or kind == "bool" else 2
            found.append((i, width, bool(eq)))
            i += width
        else:
            i += 1
    return found


def _set_flag(seq: list[Any], name: str, value: bool | int | float | str) -> None:
    """Set one flag in an args list: its last occurrence changed in place (earlier ones, which
    argparse ignores, removed), or appended when absent."""
    spans = _occurrences(seq, name)
    if not spans:  # appended as the list writes its flags and its values
        for token in to_argv({name: value}):
            flag = token.startswith("--")
            style = next((i for i in reversed(seq) if str(i).startswith("--") == flag), None)
            seq.append(_like(style, token) if isinstance(style, ScalarString) else _plain(token))
        return
    *earlier, (at, width, inline) = spans
    token = str(seq[at])
    spelled = token[2:].partition("=")[0]
    if TUNABLE[name].kind == "bool":
        spelled = spelled.removeprefix("no-")
        if inline:
            seq[at] = _like(seq[at], f"--{spelled}={'true' if value else 'false'}")
        else:
            seq[at] = _like(seq[at], f"--{spelled}" if value else f"--no-{spelled}")
    elif inline:
        seq[at] = _like(seq[at], f"--{spelled}={value}")
    else:
        seq[at + 1] = _like(seq[at + 1], str(value))
    for start, span, _ in reversed(earlier):
        del seq[start : start + span]


def _like(old: Any, text: str) -> Any:
    """``text`` written as ``old`` was: the same quotes; a number as a quoted string (args are
    strings, and so are the values a chart took as strings)."""
    if isinstance(old, ScalarString):
        return type(old)(text)
    if not isinstance(old, str):
        return DoubleQuotedScalarString(text)
    return _plain(text)


def _plain(text: str) -> Any:
    """A string that stays a string: quoted when YAML would read it as something else."""
    return DoubleQuotedScalarString(text) if _scalar_type(text) is not str else text


def _scalar_type(text: str) -> type:
    yaml = YAML(typ="safe", pure=True)
    try:
        return type(yaml.load(text))
    except YAMLError:
        return str


# --- round trip -------------------------------------------------------------------------------


def _yaml(indent: tuple[int, int, int]) -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-wrap a long line
    mapping, sequence, offset = indent
    yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
    return yaml


def _explicit_start(text: str) -> bool:
    first = next((ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")), "")
    return first.startswith("---")


def _load(text: str, file: str) -> tuple[list[Any], tuple[int, int, int]]:
    """The documents of a file and the indentation that writes it back unchanged (else the
    one that changes fewest lines)."""
    try:
        _refuse_alias_bombs(text, file)
        docs = list(_yaml(_INDENTS[0]).load_all(text))
    except YAMLError as exc:
        raise LocatorError(f"{file} is not valid YAML: {exc}") from exc
    explicit = _explicit_start(text)
    best, fewest = _INDENTS[0], None
    lines = text.splitlines()
    for indent in _INDENTS:
        again = _dump(list(_yaml(indent).load_all(text)), indent, explicit_start=explicit)
        if again == text:
            return docs if indent == _INDENTS[0] else list(_yaml(indent).load_all(text)), indent
        changed = sum(a != b for a, b in zip(lines, again.splitlines(), strict=False))
        changed += abs(len(lines) - len(again.splitlines()))
        if fewest is None or changed < fewest:
            best, fewest = indent, changed
    return list(_yaml(best).load_all(text)), best


def _refuse_alias_bombs(text: str, file: str) -> None:
    """LocatorError when the file's aliases expand past MAX_EXPANDED_NODES: counted on the
    parser's events (one pass, nothing expanded), each alias as the size of its anchor."""
    sizes: dict[str, int] = {}
    open_: list[list[Any]] = []  # [anchor, expanded size so far] per open collection
    total = 0
    for event in YAML(typ="rt").parse(text):
        if isinstance(event, CollectionStartEvent):
            open_.append([event.anchor, 1])
            continue
        if isinstance(event, CollectionEndEvent):
            anchor, size = open_.pop()
        elif isinstance(event, AliasEvent):
            anchor, size = None, sizes.get(event.anchor, 1)
        elif isinstance(event, NodeEvent):  # a scalar
            anchor, size = event.anchor, 1
        else:
            continue
        if anchor is not None:
            sizes[anchor] = size
        if open_:
            open_[-1][1] += size
        else:
            total += size
        if size > MAX_EXPANDED_NODES or total > MAX_EXPANDED_NODES:
            raise LocatorError(
                f"{file}: its YAML aliases expand to more than {MAX_EXPANDED_NODES:,} nodes "
                "(aliases of aliases, an alias bomb): ruleloop does not read it; write the "
                "values out, or alias only small parts"
            )


def _dump(docs: list[Any], indent: tuple[int, int, int], *, explicit_start: bool) -> str:
    yaml = _yaml(indent)
    yaml.explicit_start = explicit_start
    out = io.StringIO()
    yaml.dump_all(docs, out)
    return out.getvalue()
