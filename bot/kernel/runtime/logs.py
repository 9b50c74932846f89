"""The bot's log: a line a person reads (``text``) or one JSON object per line for a log
collector (``json``, python-json-logger), each with the incident and the change it is about.

The ids live in ContextVars: ``log_ids(incident_id=..., change_id=...)`` (a ``with`` block) and
``about_incident`` (a method whose first argument is an incident id) set them for the code that
runs inside, the tasks it starts and the threads it hands work to (asyncio copies the context
into both); the handler ``configured_logs`` installs writes them on every record it prints.
A JSON line (docs/operations.md, "Logs and metrics"):

    {"level": "INFO", "logger": "ruleloop.outbox", "message": "incident 7: root delivered",
     "incident_id": 7, "time": "2026-09-01T02:00:00.123456+00:00"}
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextvars import ContextVar, Token
from typing import Any, Concatenate, Literal, ParamSpec, TextIO, TypeVar

INCIDENT_ID: ContextVar[int | None] = ContextVar("ruleloop_incident_id", default=None)
CHANGE_ID: ContextVar[int | None] = ContextVar("ruleloop_change_id", default=None)
IDS = (("incident_id", "incident", INCIDENT_ID), ("change_id", "change", CHANGE_ID))

LogFormat = Literal["text", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]
LEVELS: dict[str, int] = {
    "debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
    "error": logging.ERROR,
}  # fmt: skip
OWN_LOGGERS = ("ruleloop", "bot")  # the bot's own events; libraries log warnings and errors
HANDLER = "ruleloop"  # the name of the one handler this module installs on the root logger
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JSON_FIELDS = ["levelname", "name", "message"]
JSON_NAMES = {"levelname": "level", "name": "logger"}
NOT_FIELDS = ("color_message",)  # uvicorn's coloured copy of its message

S = TypeVar("S")
P = ParamSpec("P")
R = TypeVar("R")


@contextlib.contextmanager
def log_ids(*, incident_id: int | None = None, change_id: int | None = None) -> Iterator[None]:
    """Log lines inside the block (and in the tasks and threads it starts) name this incident
    and change; None leaves an id as it was."""
    tokens: list[tuple[ContextVar[int | None], Token[int | None]]] = []
    for var, value in ((INCIDENT_ID, incident_id), (CHANGE_ID, change_id)):
        if value is not None:
            tokens.append((var, var.set(value)))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def about_incident(
    method: Callable[Concatenate[S, int, P], Awaitable[R]],
) -> Callable[Concatenate[S, int, P], Coroutine[Any, Any, R]]:
    """An async method whose first argument is an incident id logs inside ``log_ids`` of it."""

    @functools.wraps(method)
    async def run(self: S, incident_id: int, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with log_ids(incident_id=incident_id):
            return await method(self, incident_id, *args, **kwargs)

    return run


class ContextIds(logging.Filter):
    """Writes the incident and change ids in force on each record (as ``incident_id`` and
    ``change_id``), unless the call gave its own (``extra=``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for attribute, _, var in IDS:
            value = var.get()
            if value is not None and getattr(record, attribute, None) is None:
                setattr(record, attribute, value)
        return True


class TextFormatter(logging.Formatter):
    """``TEXT``, then the ids the record carries: ``... : rolled back [incident 7 change 3]``."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        ids = [
            f"{word} {getattr(record, attribute)}"
            for attribute, word, _ in IDS
            if getattr(record, attribute, None) is not None
        ]
        line = super().formatMessage(record)
        return f"{line} [{' '.join(ids)}]" if ids else line


def formatter(log_format: LogFormat) -> logging.Formatter:
    """The formatter of ``log_format``: JSON fields level, logger, message, time (ISO 8601,
    UTC), the ids, exc_info (a traceback, as one string) and any ``extra=`` of the call."""
    if log_format == "text":
        return TextFormatter(TEXT)
    from pythonjsonlogger.core import RESERVED_ATTRS
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(
        JSON_FIELDS, rename_fields=JSON_NAMES, timestamp="time",
        reserved_attrs=[*RESERVED_ATTRS, *NOT_FIELDS],
    )  # fmt: skip


def handler(log_format: LogFormat, stream: TextIO | None = None) -> logging.Handler:
    """A handler on ``stream`` (None: stderr) in ``log_format``, with the ids on its records."""
    out = logging.StreamHandler(stream)
    out.set_name(HANDLER)
    out.addFilter(ContextIds())
    out.setFormatter(formatter(log_format))
    return out


def basic_logs(level: int) -> None:
    """Text on stderr at ``level`` unless the root logger has a handler (``basicConfig``'s
    rule): every command's default; `ruleloop serve` then puts its own in its place."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(handler("text"))
        root.setLevel(level)


@contextlib.contextmanager
def configured_logs(
    log_format: LogFormat,
    log_level: LogLevel,
    *,
    debug: bool = False,
    stream: TextIO | None = None,
) -> Iterator[logging.Handler]:
    """For the block: the root logger writes ``log_format`` to ``stream`` (stderr), the bot's
    own loggers at ``log_level`` and libraries' at warning (``debug``: everything at debug), in
    place of the handler ``basic_logs`` or an outer block installed. Restored after."""
    root = logging.getLogger()
    own = [logging.getLogger(name) for name in OWN_LOGGERS]
    before = (root.level, [logger.level for logger in own])
    replaced = [h for h in root.handlers if h.get_name() == HANDLER]
    for old in replaced:
        root.removeHandler(old)
    installed = handler(log_format, stream)
    root.addHandler(installed)
    root.setLevel(logging.DEBUG if debug else logging.WARNING)
    for logger in own:
        logger.setLevel(logging.DEBUG if debug else LEVELS[log_level])
    try:
        yield installed
    finally:
        installed.flush()
        root.removeHandler(installed)
        for old in replaced:
            root.addHandler(old)
        root.setLevel(before[0])
        for logger, level in zip(own, before[1], strict=True):
            logger.setLevel(level)
