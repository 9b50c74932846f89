"""The CLI's one error boundary: advice for known errors, an id for unknown ones."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from bot.app.cli import Command
from bot.kernel.errors import EndpointError, GateFailed


def command_raising(exc: Exception) -> click.Command:
    @click.command(cls=Command)
    def boom() -> None:
        raise exc

    return boom


@pytest.mark.parametrize(
    ("exc", "code", "text"),
    [
        (EndpointError("cannot reach http://x"), 2, "error: cannot reach http://x"),
        (GateFailed("gate failed: max_ttft_p99_ms"), 1, "error: gate failed: max_ttft_p99_ms"),
    ],
)
def test_known_errors_print_one_line_with_their_exit_code(exc, code, text) -> None:
    result = CliRunner().invoke(command_raising(exc))
    assert result.exit_code == code
    assert result.stderr.strip() == text


def test_unexpected_errors_print_an_id_and_log_the_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    result = CliRunner().invoke(command_raising(KeyError("surprise")))
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    error_id = result.stderr.split("(id ")[1].split(")")[0]
    log = (tmp_path / "ruleloop" / "errors.log").read_text()
    assert f"--- {error_id}" in log and "KeyError: 'surprise'" in log
