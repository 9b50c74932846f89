"""Settings: TOML file plus environment, secrets hidden, targets validated, fail closed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.kernel.config import Settings
from bot.kernel.errors import UsageError

TOML = """
default_target = "prod-a"
[slack]
channel = "#inference-incidents"
[access]
diagnose = ["U1", "U2"]
[targets.prod-a]
vllm_url = "http://10.0.0.5:8000/"
prometheus_url = "http://prometheus:9090"
node = "gpu-7"
[targets.prod-b]
vllm_url = "http://10.0.0.6:8000"
gateway_url = "http://10.0.0.6:9000"
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "ruleloop.toml"
    path.write_text(TOML)
    return path


def test_settings_file_and_environment(config_file: Path) -> None:
    env = {
        "SLACK_BOT_TOKEN": "xoxb-secret",
        "SLACK_SIGNING_SECRET": "shh",
        "RULELOOP_CONFIG": str(config_file),
    }
    settings = Settings.load(env)
    assert settings.slack.enabled
    assert settings.slack.channel == "#inference-incidents"
    assert "xoxb-secret" not in repr(settings) and "shh" not in str(settings.slack)
    assert settings.slack.bot_token is not None
    assert settings.slack.bot_token.get_secret_value() == "xoxb-secret"
    name, target = settings.target(None)
    assert (name, target.vllm_url, target.hostport) == (
        "prod-a",
        "http://10.0.0.5:8000",
        "10.0.0.5:8000",
    )
    assert settings.targets["prod-b"].gateway_url == "http://10.0.0.6:9000"


def test_settings_environment_overrides_file(config_file: Path) -> None:
    settings = Settings.load({"RULELOOP_CHANNEL": "#other"}, path=config_file)
    assert settings.slack.channel == "#other"
    assert not settings.slack.enabled  # no tokens: console transport


@pytest.mark.parametrize(
    ("allowed", "user", "ok"),
    [([], "U1", False), (["U1"], "U1", True), (["U1"], "U9", False), (["*"], "U9", True)],
)
def test_access_fails_closed(allowed: list[str], user: str, ok: bool) -> None:
    settings = Settings.model_validate({"access": {"diagnose": allowed}})
    assert settings.access.allows("diagnose", user) is ok
    assert not settings.access.allows("apply", user)


def test_settings_unknown_target_names_known(config_file: Path) -> None:
    settings = Settings.load({}, path=config_file)
    with pytest.raises(UsageError, match="unknown target 'nope'; known targets: prod-a, prod-b"):
        settings.target("nope")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[targets.x]\nvllm_url = 'ftp://x'\n", "targets.x.vllm_url"),
        ("[slack]\nchanel = '#x'\n", "slack.chanel"),
        ("default_target = 'y'\n", "default_target 'y' is not in"),
        ("[slack\n", "not valid TOML"),
    ],
)
def test_settings_bad_file_is_usage_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        Settings.load({}, path=path)


def test_settings_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read config"):
        Settings.load({"RULELOOP_CONFIG": str(tmp_path / "none.toml")})


def test_database_url_defaults_to_sqlite_in_state_dir(tmp_path: Path) -> None:
    assert Settings().database_url(fallback_dir=tmp_path) == f"sqlite:///{tmp_path}/ruleloop.db"
    pg = Settings.load({"RULELOOP_DATABASE_URL": "postgresql+psycopg://u@db/rl"})
    assert pg.database_url(fallback_dir=tmp_path) == "postgresql+psycopg://u@db/rl"
