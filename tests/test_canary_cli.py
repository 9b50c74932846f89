"""`latency_checker` usage errors: clear messages, exit 2, no traceback, nothing sent."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from bot.app.cli import cli
from bot.app.cli.canary import canary, default_num_requests


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--endpoint", "http://x/v1/completions", "--concurrency", "-3"],
            "Invalid value for '--concurrency'",
        ),
        (["--endpoint", "http://x/v1/completions", "--bogus"], "No such option '--bogus'"),
        ([], "Missing option '--endpoint'"),
        (["--endpoint", "ftp://x/v1/completions"], "is not an http(s) URL"),
        (
            ["--endpoint", "http://x/v1/models"],
            "must end in /v1/completions or /v1/chat/completions",
        ),
        (
            [
                "--endpoint",
                "http://x/v1/completions",
                "--prompt-length",
                "8",
                "--prefix-length",
                "8",
            ],
            "--prefix-length must be between 0",
        ),
        (
            ["--endpoint", "http://x/v1/completions", "--min-goodput-ratio", "1.5"],
            "Invalid value for '--min-goodput-ratio'",
        ),
        (
            ["--endpoint", "http://x/v1/completions", "--cancel-mode", "sometimes"],
            "Invalid value for '--cancel-mode'",
        ),
        (
            ["--endpoint", "http://x/v1/completions", "--max-error-rate", "2"],
            "Invalid value for '--max-error-rate'",
        ),
        (
            [
                "--endpoint",
                "http://x/v1/completions",
                "--pulse",
                "--pulse-width",
                "60",
                "--pulse-period",
                "30",
            ],
            "--pulse-width (60 s) must be shorter than --pulse-period (30 s)",
        ),
        (
            ["--endpoint", "http://x/v1/completions", "--pulse", "--request-rate", "5"],
            "--pulse shapes fixed-concurrency load; drop --request-rate",
        ),
    ],
)
def test_bad_usage_exits_2_with_a_clear_message(args: list[str], message: str) -> None:
    result = CliRunner().invoke(canary, args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_help_teaches_the_seed_command_and_exit_codes() -> None:
    result = CliRunner().invoke(canary, ["--help"])
    assert result.exit_code == 0
    for text in (
        "--max-ttft-p99-ms",
        "--min-goodput-ratio",
        "--prompt-length",
        "Exit codes: 0 all gates passed",
        "--max-error-rate",
        "--pulse",
        "Failed requests fail the gate",
    ):
        assert text in result.output


def test_ruleloop_exposes_canary_engine_and_demo() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for command in ("canary", "engine", "demo"):
        assert command in result.output


@pytest.mark.parametrize(("concurrency", "count"), [(1, 100), (20, 100), (150, 750)])
def test_default_request_count_keeps_the_asked_concurrency_in_flight(
    concurrency: int, count: int
) -> None:
    assert default_num_requests(concurrency) == count
