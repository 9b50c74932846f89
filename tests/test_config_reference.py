"""docs/configuration.md is generated from the settings model, and stays in step with it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, Union, get_args, get_origin

import pytest
from click.testing import CliRunner
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from bot.app.cli import cli
from bot.app.cli.config_reference import render
from bot.kernel.config import ENV_KEYS, Settings

DOC = Path(__file__).parent.parent / "docs" / "configuration.md"
REGENERATE = "docs/configuration.md is out of date: run `ruleloop config reference > docs/configuration.md`"  # fmt: skip


def sections(doc: str) -> dict[str, set[str]]:
    """Each `## heading` of the reference with the keys of its table."""
    out: dict[str, set[str]] = {}
    heading = ""
    for line in doc.splitlines():
        if line.startswith("## "):
            heading = line[3:]
            out[heading] = set()
        elif heading and (m := re.match(r"^\| `([^`]+)` \|", line)):
            out[heading].add(m[1])
    return out


def models_in(tp: object) -> list[type[BaseModel]]:
    """The settings models a field's type holds, through Optional, unions, dicts and lists."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    if get_origin(tp) is Annotated:
        return models_in(get_args(tp)[0])
    return [m for arg in get_args(tp) for m in models_in(arg)]


def reachable(model: type[BaseModel]) -> list[type[BaseModel]]:
    """Every model reachable from ``model`` through its fields, ``model`` first."""
    found = [model]
    for info in model.model_fields.values():
        for sub in models_in(info.annotation):
            found += [m for m in reachable(sub) if m not in found]
    return found


def assert_every_field_documented(model: type[BaseModel], doc: str) -> None:
    """Each model has a section listing exactly its keys; each nested table has a heading."""
    tables = sections(doc)
    for sub in reachable(model):
        keys = {n for n, info in sub.model_fields.items() if not models_in(info.annotation)}
        nested = [n for n, info in sub.model_fields.items() if models_in(info.annotation)]
        if keys:
            assert keys in tables.values(), f"{sub.__name__}: no section lists {sorted(keys)}"
        for name in nested:
            assert any(re.search(rf"[\[.]{name}[\].]", h) for h in tables), f"no [..{name}] table"


def test_committed_reference_is_the_generated_one() -> None:
    assert DOC.read_text() == render(), REGENERATE


def test_every_settings_field_is_in_the_reference() -> None:
    assert_every_field_documented(Settings, DOC.read_text())
    doc = DOC.read_text()
    for var, (section, key) in ENV_KEYS.items():
        assert f"| `{var}` | `{section}.{key}` |" in doc
        (row,) = [
            ln for ln in doc.splitlines() if f"| `{var}` |" in ln and ln.startswith(f"| `{key}`")
        ]
        assert "**secret**" in row or not key.endswith(("token", "secret")), row


def test_cli_prints_the_reference() -> None:
    result = CliRunner().invoke(cli, ["config", "reference"])
    assert result.exit_code == 0, result.output
    assert result.output == render()


# A model with every shape the generator must handle, as the lead's new settings may use.


class _S(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Local(_S):
    """Run it here."""

    kind: Literal["local"]
    flags: list[str] = Field(default_factory=lambda: ["--enforce-eager"])


class Remote(_S):
    """Run it there."""

    kind: Literal["remote"]
    url: str = Field(description="where it runs")


class Check(_S):
    """One scheduled check."""

    every_s: float = Field(default=60.0, gt=0, le=3600)
    # the runbook to run
    runbook: str


class Pool(_S):
    """A pool of engines."""

    size: int = Field(default=1, ge=1)
    runner: Annotated[Local | Remote, Field(discriminator="kind")] | None = None
    checks: list[Check] = Field(default_factory=list)


class Auth(_S):
    """Credentials."""

    token: SecretStr | None = None  # from the environment only
    mode: Literal["a", "b"] = "a"


class Example(_S):
    """Everything."""

    name: str = "x"
    auth: Auth = Field(default_factory=Auth)
    pools: dict[str, Pool] = Field(default_factory=dict)
    jobs: list[Check] = Field(default_factory=list)
    either: Union[Local, Remote] = Field(default_factory=lambda: Local(kind="local"))  # noqa: UP007


def test_generator_handles_nested_dicts_lists_and_unions() -> None:
    doc = render(
        Example, env_keys={"EXAMPLE_TOKEN": ("auth", "token")}, config_env="EXAMPLE_CONFIG"
    )
    assert_every_field_documented(Example, doc)
    headings = list(sections(doc))
    assert headings == [
        "top-level keys",
        "`[auth]`",
        "`[pools.<name>]`",
        '`[pools.<name>.runner]` with `kind = "local"`',
        '`[pools.<name>.runner]` with `kind = "remote"`',
        "`[[pools.<name>.checks]]`",
        "`[[jobs]]`",
        '`[either]` with `kind = "local"`',
        '`[either]` with `kind = "remote"`',
    ]
    lines = doc.splitlines()
    assert "| `token` | string, **secret** | unset | `EXAMPLE_TOKEN` | from the environment only |" in lines  # fmt: skip
    assert '| `mode` | "a" or "b" | `"a"` |  |  |' in lines
    assert "| `every_s` | number (> 0, <= 3600) | `60.0` |  |  |" in lines
    assert "| `runbook` | string | **required** |  | the runbook to run |" in lines
    assert '| `flags` | list of string | `["--enforce-eager"]` |  |  |' in lines
    assert "| `url` | string | **required** |  | where it runs |" in lines
    assert "One table per name, e.g. `[pools.prod-a]`." in doc
    assert "`EXAMPLE_CONFIG`" in doc


def test_reference_check_fails_when_a_field_is_missing() -> None:
    class Extended(Settings):
        """Everything the bot is configured with."""

        scheduler_interval_s: float = 30.0

    assert render(Extended) != DOC.read_text()
    with pytest.raises(AssertionError, match="Extended: no section lists"):
        assert_every_field_documented(Extended, DOC.read_text())
