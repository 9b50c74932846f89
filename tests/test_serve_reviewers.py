"""Drafts need a reviewer: the shipped configs name one (a placeholder to fill in) and
`ruleloop serve` warns at start while nobody, or only the placeholder, may accept a draft."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.app.cli import cli
from bot.app.cli.serve import PLACEHOLDER_REVIEWER, reviewer_warning
from bot.kernel.config import Settings

ROOT = Path(__file__).parent.parent
SHIPPED = sorted((ROOT / "deploy").rglob("ruleloop.toml")) + sorted(
    (ROOT / "docs" / "examples").rglob("*.toml")
)
# what the shipped Secret provides (the example's [web] public_url needs the link secret)
ENV = {"RULELOOP_WEB_SECRET": "x" * 32}


def test_every_shipped_config_parses_and_names_a_reviewer() -> None:
    assert len(SHIPPED) >= 2
    for path in SHIPPED:
        settings = Settings.load(ENV, path=path)
        assert settings.access.review, f"{path.relative_to(ROOT)}: [access] review is empty"
        # a placeholder, and its comment says how to fill it in
        assert PLACEHOLDER_REVIEWER in settings.access.review
        assert "placeholder" in path.read_text()


def test_no_reviewer_and_the_placeholder_are_warnings() -> None:
    nobody = Settings.load({}, path=None)
    assert reviewer_warning(nobody) == (
        "nobody can accept a draft ADR: set [access] review = [...] (Slack user or group IDs)"
    )
    shipped = Settings.load({}, path=ROOT / "deploy" / "kubernetes" / "base" / "ruleloop.toml")
    assert "placeholder S0REVIEWERS" in (reviewer_warning(shipped) or "")
    filled = shipped.model_copy(
        update={"access": shipped.access.model_copy(update={"review": ["U1"]})}
    )
    assert reviewer_warning(filled) is None


def start_serve(tmp_path: Path, access: str) -> str:
    """`ruleloop serve` on a busy port (it stops at the bind, after the start-up checks)."""
    path = tmp_path / "ruleloop.toml"
    path.write_text(access)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(cli, ["serve", "--config", str(path), "--port", str(port)])
    assert result.exit_code == 2
    return result.output


def test_serve_warns_at_start_when_nobody_may_review(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="bot.app.cli.serve"):
        start_serve(tmp_path, '[access]\napply = ["U1"]\n')
    assert "nobody can accept a draft ADR: set [access] review = [...]" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bot.app.cli.serve"):
        start_serve(tmp_path, '[access]\nreview = ["U1"]\n')
    assert "draft ADR" not in caplog.text and "review" not in caplog.text
