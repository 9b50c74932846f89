"""The configuration reference (docs/configuration.md), generated from the settings model.

The model is walked generically, so new settings appear without touching this module: a field
whose type is a model is a TOML table; a dict of models is one table per name
(``[targets.<name>]``); a list of models is an array of tables (``[[name]]``); a union of
models is one table per variant. Each key gets its type (with its limits), its default, the
environment variable that overrides it (``ENV_KEYS``) and a description: ``Field(description=)``
where set, else the comment on the field's line or the comment lines just above it.
"""

from __future__ import annotations

import ast
import datetime as dt
import enum
import functools
import inspect
import io
import json
import textwrap
import tokenize
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretBytes, SecretStr
from pydantic.fields import FieldInfo

from bot.kernel import CONFIG_ENV, ENV_KEYS, Settings

NAME = "<name>"
_SCALARS = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    Path: "path",
    SecretStr: "string",
    SecretBytes: "bytes",
    dt.date: "date",
    dt.datetime: "date-time",
}
_LIMITS = (
    ("ge", ">="),
    ("gt", ">"),
    ("le", "<="),
    ("lt", "<"),
    ("multiple_of", "multiple of"),
    ("min_length", "min length"),
    ("max_length", "max length"),
    ("pattern", "matches"),
)


@dataclass(frozen=True)
class Key:
    """One key of a table, as the reference shows it."""

    name: str
    type: str
    default: str
    env: str | None
    secret: bool
    description: str


@dataclass
class Table:
    """One TOML table: its dotted path (``<name>`` for a dict key, ``[]`` for an array)."""

    path: str
    doc: str
    note: str = ""
    variant: str = ""
    keys: list[Key] = field(default_factory=list)

    @property
    def heading(self) -> str:
        """How the table is written in TOML: ``[slack]``, ``[targets.<name>]``, ``[[x]]``."""
        if not self.path:
            return "top-level keys"
        if self.path.endswith("[]"):
            heading = f"`[[{self.path[:-2].replace('[]', '')}]]`"
        else:
            heading = f"`[{self.path.replace('[]', '')}]`"
        return f"{heading} with {self.variant}" if self.variant else heading


def tables(model: type[BaseModel], *, env_keys: Mapping[str, tuple[str, ...]]) -> list[Table]:
    """Every table of a settings model, parents before their children."""
    env = {".".join(where): var for var, where in env_keys.items()}
    out: list[Table] = []
    _walk(model, path="", note="", variant="", env=env, out=out)
    return out


def _walk(
    model: type[BaseModel],
    *,
    path: str,
    note: str,
    variant: str,
    env: dict[str, str],
    out: list[Table],
) -> None:
    doc = inspect.cleandoc(model.__doc__ or "")
    table = Table(path=path, doc=doc, note=note, variant=variant)
    out.append(table)
    comments = _comments(model)
    children: list[tuple[str, list[type[BaseModel]], str]] = []
    for name, info in model.model_fields.items():
        sub = f"{path}.{name}" if path else name
        nested = _nested(info.annotation)
        if nested is not None:
            suffix, models, optional = nested
            children.append((sub + suffix, models, _where(sub + suffix, info, optional)))
            continue
        plain = sub.replace("[]", "").replace(f".{NAME}", "")
        table.keys.append(
            Key(
                name=name,
                type=_type(info.annotation, info.metadata),
                default=_default(info),
                env=env.get(plain),
                secret=_has(info.annotation, (SecretStr, SecretBytes)),
                description=info.description or comments.get(name, ""),
            )
        )
    for child, models, where in children:
        if len(models) == 1:
            _walk(models[0], path=child, note=where, variant="", env=env, out=out)
            continue
        names = ", ".join(_variant(m) for m in models)
        for m in models:
            note = f"{where} One of: {names}.".strip()
            _walk(m, path=child, note=note, variant=_variant(m), env=env, out=out)


def _where(path: str, info: FieldInfo, optional: bool) -> str:
    """Where a nested table goes and whether it may be left out, in a sentence or two."""
    example = path.replace("[]", "").replace(NAME, "prod-a")
    parts = []
    if path.endswith("[]"):
        parts.append(f"An array of tables: one `[[{example}]]` per entry.")
    elif path.endswith(NAME):
        parts.append(f"One table per name, e.g. `[{example}]`.")
    elif NAME in path:
        parts.append(f"Written as e.g. `[{example}]`.")
    if path.endswith(("[]", NAME)):
        pass
    elif info.is_required() and not optional:
        parts.append("Required.")
    elif optional or info.default is None:
        parts.append("Optional: unset unless given.")
    else:
        parts.append("Optional: every key has a default.")
    return " ".join(parts)


def _variant(model: type[BaseModel]) -> str:
    """A union member by its tag (``kind = "local"``) or, without one, its class name."""
    for name, info in model.model_fields.items():
        values = get_args(info.annotation) if get_origin(info.annotation) is Literal else ()
        if len(values) == 1:
            return f"`{name} = {json.dumps(values[0])}`"
    return f"`{model.__name__}`"


def _unwrap(tp: Any) -> tuple[Any, list[Any]]:
    metadata: list[Any] = []
    while get_origin(tp) is Annotated:
        tp, *extra = get_args(tp)
        metadata += extra
    return tp, metadata


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _is_model(tp: Any) -> bool:
    return inspect.isclass(tp) and issubclass(tp, BaseModel)


def _nested(tp: Any) -> tuple[str, list[type[BaseModel]], bool] | None:
    """(path suffix, models, optional) when the type holds settings models, else None."""
    tp, _ = _unwrap(tp)
    if _is_union(tp):
        members = [a for a in get_args(tp) if a is not type(None)]
        optional = len(members) < len(get_args(tp))
        if len(members) == 1:
            inner = _nested(members[0])
            return None if inner is None else (inner[0], inner[1], optional or inner[2])
        found = [_nested(a) for a in members]
        if all(f is not None and f[0] == "" for f in found):
            return "", [m for f in found if f is not None for m in f[1]], optional
        return None
    if _is_model(tp):
        return "", [tp], False
    origin, args = get_origin(tp), get_args(tp)
    if origin in (dict, Mapping) and len(args) == 2 and (inner := _nested(args[1])):
        return f".{NAME}{inner[0]}", inner[1], False
    if origin in (list, tuple, set, frozenset, Sequence) and args and (inner := _nested(args[0])):
        return f"[]{inner[0]}", inner[1], False
    return None


def _type(tp: Any, metadata: Sequence[Any] = ()) -> str:
    """A type in words: ``integer (>= 0, < 65536)``, ``list of string``, ``"a" or "b"``."""
    tp, extra = _unwrap(tp)
    limits = [
        f"{word} {_number(getattr(m, attr))}"
        for m in [*metadata, *extra]
        for attr, word in _LIMITS
        if getattr(m, attr, None) is not None
    ]
    suffix = f" ({', '.join(limits)})" if limits else ""
    origin, args = get_origin(tp), get_args(tp)
    if _is_union(tp):
        members = [a for a in args if a is not type(None)]
        return " or ".join(_type(a) for a in members) + suffix
    if origin is Literal:
        return " or ".join(json.dumps(v) for v in args)
    if origin in (list, tuple, set, frozenset, Sequence):
        return f"list of {_type(args[0]) if args else 'any'}{suffix}"
    if origin in (dict, Mapping):
        return f"table of {_type(args[1]) if len(args) == 2 else 'any'}{suffix}"
    if inspect.isclass(tp) and issubclass(tp, enum.Enum):
        return " or ".join(json.dumps(m.value) for m in tp)
    name = _SCALARS.get(tp) or getattr(tp, "__name__", None) or str(tp)
    return name + suffix


def _number(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _has(tp: Any, wanted: tuple[type, ...]) -> bool:
    tp, _ = _unwrap(tp)
    if inspect.isclass(tp) and issubclass(tp, wanted):
        return True
    return any(_has(arg, wanted) for arg in get_args(tp))


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        if info.default_factory_takes_validated_data:
            return "(computed)"
        value = info.default_factory()  # type: ignore[call-arg]
    else:
        value = info.default
    return "unset" if value is None else f"`{_toml(value)}`"


def _toml(value: object) -> str:
    """A default as it would be written in the TOML file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, SecretStr | SecretBytes):
        return '"**********"'
    if isinstance(value, enum.Enum):
        return _toml(value.value)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path | dt.date):
        return json.dumps(str(value), ensure_ascii=False)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple | set | frozenset):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, BaseModel):
        return _toml(value.model_dump())
    return json.dumps(str(value))


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """Each field's comment: on its line(s), or the comment lines right above it."""
    out: dict[str, str] = {}
    for cls in reversed([c for c in model.__mro__ if _is_model(c) and c is not BaseModel]):
        out |= _own_comments(cls)
    return out


@functools.cache
def _own_comments(cls: type[BaseModel]) -> dict[str, str]:
    """The comments of the fields a class itself declares (parsing its source once)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    notes = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    out: dict[str, str] = {}
    for stmt in getattr(ast.parse(source).body[0], "body", []):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        end = stmt.end_lineno or stmt.lineno
        texts = [notes[n] for n in range(stmt.lineno, end + 1) if n in notes]
        above = stmt.lineno - 1
        while above in notes and lines[above - 1].lstrip().startswith("#"):
            texts.insert(0, notes[above])
            above -= 1
        if texts:
            out[stmt.target.id] = " ".join(texts)
    return out


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


INTRO = """\
# Configuration reference

<!-- Generated from bot/kernel/config.py by `ruleloop config reference > docs/configuration.md`;
     do not edit by hand: tests/test_config_reference.py fails when it is out of date. -->

`ruleloop serve` reads one TOML file (`--config`, else `${config_env}`) and then the
environment, which wins over the file. Keys are grouped by the TOML table they live in; the
*environment* column names the variable that overrides a key. Keys marked **secret** are
never printed or logged: set them through the environment (a Kubernetes Secret), not in a file
that is reviewed in git. A missing key takes its default; an unknown key is refused when the bot
starts, with the file, the key and why.

| environment | sets |
|---|---|
{env_rows}
"""


def render(
    model: type[BaseModel] = Settings,
    *,
    env_keys: Mapping[str, tuple[str, ...]] = ENV_KEYS,
    config_env: str = CONFIG_ENV,
) -> str:
    """The Markdown reference of every table and key of a settings model."""
    env_rows = [f"| `{config_env}` | the TOML file to read |"]
    env_rows += [f"| `{var}` | `{'.'.join(where)}` |" for var, where in env_keys.items()]
    parts = [INTRO.format(config_env=config_env, env_rows="\n".join(env_rows))]
    for table in tables(model, env_keys=env_keys):
        parts.append(f"\n## {table.heading}\n")
        parts += [f"\n{text}\n" for text in (table.doc, table.note) if text]
        if not table.keys:
            parts.append("\nNo keys of its own: only the tables below.\n")
            continue
        parts.append(
            "\n| key | type | default | environment | description |\n|---|---|---|---|---|\n"
        )
        for key in table.keys:
            kind = key.type + (", **secret**" if key.secret else "")
            env = f"`{key.env}`" if key.env else ""
            parts.append(
                f"| `{key.name}` | {_cell(kind)} | {_cell(key.default)} | {env} | "
                f"{_cell(key.description)} |\n"
            )
    return "".join(parts)
