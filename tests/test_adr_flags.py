"""The tunable-flag allowlist: types, ranges, shell safety, argv form, and reading flag text."""

from __future__ import annotations

import pytest

from bot.adr.flags import TUNABLE, check_engine_args, parse_flags, to_argv
from bot.kernel.errors import AdrError, UsageError


@pytest.mark.parametrize(
    ("args", "argv"),
    [
        (
            {"enable-chunked-prefill": True, "max-num-batched-tokens": 2048, "block-size": 32},
            ["--enable-chunked-prefill", "--max-num-batched-tokens", "2048", "--block-size", "32"],
        ),
        ({"enable_prefix_caching": False}, ["--no-enable-prefix-caching"]),
        (
            {"gpu-memory-utilization": 0.9, "kv-cache-dtype": "fp8"},
            ["--gpu-memory-utilization", "0.9", "--kv-cache-dtype", "fp8"],
        ),
        ({}, []),
    ],
)
def test_to_argv_turns_validated_args_into_a_list(args: dict[str, object], argv: list[str]) -> None:
    assert to_argv(args) == argv  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "field", "why"),
    [
        ({"tensor-parallel-size": 2}, "tensor-parallel-size", "is not a tunable flag"),
        ({"--block-size": 32}, "--block-size", "without dashes in front"),
        ({"block-size": "32"}, "block-size", "must be an integer from 8 to 512"),
        (
            {"block-size": 7},
            "block-size",
            "out of range: must be an integer from 8 to 512, a multiple of 8",
        ),
        ({"block-size": 1024}, "block-size", "out of range"),
        ({"max-num-batched-tokens": 2048.5}, "max-num-batched-tokens", "must be an integer"),
        ({"max-num-batched-tokens": True}, "max-num-batched-tokens", "must be an integer"),
        ({"gpu-memory-utilization": 1.5}, "gpu-memory-utilization", "out of range"),
        ({"gpu-memory-utilization": float("nan")}, "gpu-memory-utilization", "must be a number"),
        ({"enable-chunked-prefill": "yes"}, "enable-chunked-prefill", "must be true or false"),
        ({"kv-cache-dtype": "int3"}, "kv-cache-dtype", "is not one of auto"),
        ({"kv-cache-dtype": "fp8; rm -rf /"}, "kv-cache-dtype", "shell metacharacter"),
        ({"kv-cache-dtype": "fp8\n--trust-remote-code"}, "kv-cache-dtype", "a newline"),
        ({"scheduling-policy": "$(reboot)"}, "scheduling-policy", "shell metacharacter"),
        ({"block-size; rm": 32}, "block-size; rm", "shell characters"),
        ({"block-size": 32, "block_size": 64}, "block_size", "set twice"),
    ],
)
def test_check_engine_args_refuses_with_field_and_why(
    args: dict[str, object], field: str, why: str
) -> None:
    problems = check_engine_args(args)
    assert problems, "expected a refusal"
    assert problems[0][0] == f"fix.engine_args.{field}"
    assert why in problems[0][1]


def test_to_argv_raises_adr_error_naming_file_and_field() -> None:
    with pytest.raises(AdrError, match=r"^adr/x.md: fix.engine_args.block-size: .*out of range"):
        to_argv({"block-size": 7}, file="adr/x.md")


@pytest.mark.parametrize(
    ("name", "described"),
    [
        ("enable-chunked-prefill", "true or false"),
        ("block-size", "an integer from 8 to 512, a multiple of 8"),
        ("gpu-memory-utilization", "a number from 0.05 to 1"),
        ("scheduling-policy", "one of fcfs, priority"),
    ],
)
def test_a_tunable_flag_describes_its_values_in_words(name: str, described: str) -> None:
    assert TUNABLE[name].describe() == described


def test_every_tunable_flag_describes_its_values() -> None:
    for spec in TUNABLE.values():
        text = spec.describe()
        # a description names the kind and, for numbers, both ends of the range
        kind = {"bool": "true or false", "int": "an integer", "float": "a number"}
        assert text.startswith(kind.get(spec.kind, "one of ")), (spec.name, text)
        if spec.kind in ("int", "float"):
            assert f"{spec.minimum:g}" in text and f"{spec.maximum:g}" in text, (spec.name, text)
        if spec.kind == "choice":
            assert all(choice in text for choice in spec.choices), (spec.name, text)
        assert len(spec.help.split()) >= 2, f"{spec.name}: say what the flag does"


@pytest.mark.parametrize(
    ("text", "args"),
    [
        (
            "--enable-chunked-prefill --max-num-batched-tokens 2048 --block-size=32",
            {"enable-chunked-prefill": True, "max-num-batched-tokens": 2048, "block-size": 32},
        ),
        (
            "--no-enable-prefix-caching --gpu_memory_utilization 0.8",
            {"enable-prefix-caching": False, "gpu-memory-utilization": 0.8},
        ),
        ("", {}),
    ],
)
def test_parse_flags_reads_command_line_text(text: str, args: dict[str, object]) -> None:
    assert parse_flags(text) == args


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("--tensor-parallel-size 2", "not a tunable flag"),
        ("block-size 32", "expected a --flag"),
        ("--block-size", "needs a value"),
        ("--block-size abc", "must be an integer"),
        ("--enforce-eager=true", "takes no value"),
        ("--kv-cache-dtype 'fp8", "cannot read flags"),
    ],
)
def test_parse_flags_refuses_what_it_cannot_read(text: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        parse_flags(text)
