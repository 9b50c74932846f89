"""The tunable vLLM flags an ADR may set, with their types and ranges, and their argv form.

Only flags on this allowlist ever reach an engine's command line. The allowlist spans vLLM
versions (a few flags here were removed in newer releases); whether the installed vLLM knows a
flag is a separate check against vLLM's own parser (``bot.adr.vllm_args``).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from bot.kernel import AdrError, UsageError

EngineArgs = Mapping[str, "bool | int | float | str"]

# Anything a shell would interpret, and all whitespace (newlines included).
_UNSAFE = re.compile(r"""[\s;&|$`<>(){}\[\]*?!~#'"\\]""")


@dataclass(frozen=True)
class FlagSpec:
    """One tunable flag: its name without dashes, its kind and its allowed values."""

    name: str
    kind: Literal["bool", "int", "float", "choice"]
    help: str
    minimum: float | None = None
    maximum: float | None = None
    multiple_of: int | None = None
    choices: tuple[str, ...] = ()

    def describe(self) -> str:
        """The allowed values in words, e.g. 'an integer from 8 to 512, a multiple of 8'."""
        if self.kind == "bool":
            return "true or false"
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        noun = "an integer" if self.kind == "int" else "a number"
        text = f"{noun} from {self.minimum:g} to {self.maximum:g}"
        return text + (f", a multiple of {self.multiple_of}" if self.multiple_of else "")


TUNABLE: dict[str, FlagSpec] = {
    spec.name: spec
    for spec in (
        FlagSpec("enable-chunked-prefill", "bool", "split long prefills across steps"),
        FlagSpec("enable-prefix-caching", "bool", "reuse KV blocks of shared prompt prefixes"),
        FlagSpec("enforce-eager", "bool", "no CUDA graphs (faster start, same kernels)"),
        FlagSpec("async-scheduling", "bool", "overlap scheduling with execution"),
        FlagSpec(
            "max-num-batched-tokens", "int", "token budget of one scheduler step", 16, 1_048_576
        ),
        FlagSpec("max-num-seqs", "int", "sequences in one step", 1, 4096),
        FlagSpec("block-size", "int", "tokens per KV-cache block", 8, 512, multiple_of=8),
        FlagSpec(
            "gpu-memory-utilization", "float", "share of device memory vLLM may use", 0.05, 1.0
        ),
        FlagSpec(
            "num-gpu-blocks-override", "int", "fixed number of KV-cache blocks", 1, 10_000_000
        ),
        FlagSpec("max-model-len", "int", "longest prompt + output accepted", 16, 1_048_576),
        FlagSpec(
            "long-prefill-token-threshold", "int", "prompt length counted as long", 0, 1_048_576
        ),
        FlagSpec("stream-interval", "int", "tokens per streamed chunk", 1, 64),
        FlagSpec(
            "kv-cache-dtype",
            "choice",
            "KV-cache element type",
            choices=("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"),
        ),
        FlagSpec("scheduling-policy", "choice", "queue order", choices=("fcfs", "priority")),
        # Older vLLM only: kept so ADRs written for those fleets validate; the installed
        # vLLM's parser says whether it still takes them.
        FlagSpec("swap-space", "float", "CPU swap space per GPU, GiB (vLLM < 0.11)", 0, 1024),
        FlagSpec(
            "max-num-partial-prefills", "int", "concurrent partial prefills (vLLM < 0.11)", 1, 64
        ),
    )
}


def canonical(name: str) -> str:
    """The allowlist spelling of a flag name: dashes, no leading '--' (vLLM takes both)."""
    return name.replace("_", "-")


def check_engine_args(
    args: Mapping[str, object], *, field: str = "fix.engine_args"
) -> list[tuple[str, str]]:
    """Every problem with an engine_args mapping, as (field, why) pairs; empty when fine."""
    problems: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for key, value in args.items():
        where = f"{field}.{key}"
        if not isinstance(key, str) or _UNSAFE.search(key) or not key:
            problems.append(
                (where, "flag names may not contain spaces, newlines or shell characters")
            )
            continue
        if key.startswith("-"):
            problems.append(
                (where, f"write the flag name without dashes in front: {key.lstrip('-')!r}")
            )
            continue
        spec = TUNABLE.get(canonical(key))
        if spec is None:
            problems.append(
                (where, f"{key!r} is not a tunable flag; allowed: {', '.join(TUNABLE)}")
            )
            continue
        if spec.name in seen:
            problems.append((where, f"set twice (also as {seen[spec.name]!r})"))
            continue
        seen[spec.name] = key
        why = _check_value(spec, value)
        if why:
            problems.append((where, why))
    return problems


def _check_value(spec: FlagSpec, value: object) -> str | None:
    if isinstance(value, str) and _UNSAFE.search(value):
        return f"value {value!r} contains whitespace, a newline or a shell metacharacter"
    if spec.kind == "bool":
        return None if isinstance(value, bool) else f"must be true or false, not {value!r}"
    if spec.kind == "choice":
        return None if value in spec.choices else f"{value!r} is not {spec.describe()}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be {spec.describe()}, not {value!r}"
    if spec.kind == "int" and not isinstance(value, int):
        return f"must be an integer, not {value!r}"
    if not math.isfinite(value):
        return f"must be {spec.describe()}, not {value!r}"
    assert spec.minimum is not None and spec.maximum is not None
    if not spec.minimum <= value <= spec.maximum or (
        spec.multiple_of and int(value) % spec.multiple_of
    ):
        return f"{value!r} is out of range: must be {spec.describe()}"
    return None


def to_argv(args: EngineArgs, *, file: str | None = None) -> list[str]:
    """The vLLM argv for a validated engine_args mapping (a list, never a shell string)."""
    problems = check_engine_args(args)
    if problems:
        field, why = problems[0]
        raise AdrError(why, file=file, field=field)
    argv: list[str] = []
    for key, value in args.items():
        name = canonical(key)
        if isinstance(value, bool):
            argv.append(f"--{name}" if value else f"--no-{name}")
        else:
            argv += [f"--{name}", str(value)]
    return argv


def parse_flags(text: str) -> dict[str, bool | int | float | str]:
    """Read flags written as on a command line ('--block-size 32 --enable-chunked-prefill')."""
    try:
        tokens = shlex.split(text, comments=False, posix=True)
    except ValueError as exc:
        raise UsageError(f"cannot read flags {text!r}: {exc}") from exc
    out: dict[str, bool | int | float | str] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--"):
            raise UsageError(f"in flags {text!r}: expected a --flag, got {token!r}")
        name, eq, inline = token[2:].partition("=")
        name = canonical(name)
        negated = name.startswith("no-") and name[3:] in TUNABLE
        spec = TUNABLE.get(name[3:] if negated else name)
        if spec is None:
            raise UsageError(f"--{name} is not a tunable flag; allowed: {', '.join(TUNABLE)}")
        if spec.kind == "bool":
            if eq:
                raise UsageError(f"--{name} takes no value (use --no-{spec.name} for false)")
            out[spec.name] = not negated
            i += 1
            continue
        if not eq:
            if i + 1 >= len(tokens):
                raise UsageError(f"--{name} needs a value ({spec.describe()})")
            inline, i = tokens[i + 1], i + 1
        out[spec.name] = _convert(spec, inline)
        i += 1
    return out


def _convert(spec: FlagSpec, raw: str) -> int | float | str:
    try:
        if spec.kind == "int":
            return int(raw)
        if spec.kind == "float":
            return float(raw)
    except ValueError:
        raise UsageError(f"--{spec.name} {raw!r}: must be {spec.describe()}") from None
    return raw
