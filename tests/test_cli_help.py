"""The command line's help and its arguments (issue 22, item 14): `ruleloop --help` loads
neither matplotlib nor Slack, says what each command does, and `serve` checks its port.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from bot.app.cli import COMMANDS, SUMMARIES, cli
from tests.fakes.bot import ROOT, harness

HEAVY = ("matplotlib", "slack_bolt", "slack_sdk")


@pytest.mark.parametrize("args", [["--help"], ["demo", "--help"], ["serve", "--help"]])
def test_help_loads_neither_matplotlib_nor_slack(args: list[str]) -> None:
    """Before: listing the commands imported every command's module: the demo's brought the bot,
    matplotlib and Slack (3.5-3.9 s warm for `ruleloop --help`)."""
    script = (
        "import json, sys\n"
        "from click.testing import CliRunner\n"
        "from bot.app.cli import cli\n"
        f"result = CliRunner().invoke(cli, {args!r})\n"
        "assert result.exit_code == 0, result.output\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_every_command_has_its_summary_and_is_registered_under_its_name() -> None:
    assert set(SUMMARIES) == set(COMMANDS)
    group = click.Group()
    for name, module in COMMANDS.items():
        importlib.import_module(module).register(group)
        assert name in group.commands, f"{module} does not register {name}"
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name, summary in SUMMARIES.items():
        assert " ".join(summary.split()[:3]) in " ".join(result.output.split()), name


def test_the_demo_is_described_as_the_whole_loop() -> None:
    """Before: `demo` was said to print "the four-metric baseline"."""
    text = " ".join(CliRunner().invoke(cli, ["--help"]).output.split())
    assert "four-metric baseline" not in text
    for step in ("diagnosis", "canary", "draft", "workload drift re-validation"):
        assert step in text


@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_serve_refuses_a_port_out_of_range_with_a_usage_error(port: str) -> None:
    """Before: `serve --port 99999` was an "unexpected failure" with an error id."""
    result = CliRunner().invoke(cli, ["serve", "--port", port])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--port'" in result.output and "0<=x<=65535" in result.output
    assert "unexpected" not in result.output


def test_agent_help_names_the_token_path_the_shipped_component_mounts() -> None:
    """Before: the help's example said /var/run/secrets/ruleloop-agent/token."""
    component = ROOT / "deploy" / "kubernetes" / "components" / "nvml-agent"
    patch = yaml.safe_load(yaml.safe_load((component / "kustomization.yaml").read_text())
                           ["patches"][0]["patch"])  # fmt: skip
    (mount,) = patch["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    text = CliRunner().invoke(cli, ["agent", "--help"]).output
    assert f'gpu_agent_token_file = "{mount["mountPath"]}/token"' in text


def test_license_is_the_apache_license_pyproject_names() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # an SPDX expression (the `{text = ...}` table is deprecated) and the file it is in
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) == 202


async def test_console_charts_go_to_the_configured_state_directory(tmp_path: Path) -> None:
    """Before: with [paths] state set, the store went there but the console's charts went
    to serve's --state-dir (by default ~/.local/state/ruleloop/charts)."""
    from tests.fakes.alerts import alert, body

    configured = tmp_path / "configured"
    paths = {"runbooks": str(tmp_path / "runbooks"), "adr": str(tmp_path / "adr"),
             "state": str(configured)}  # fmt: skip
    (tmp_path / "runbooks").mkdir()
    (tmp_path / "adr").mkdir()
    h = harness(tmp_path, slack=None, matching_adr=True, paths=paths)
    try:
        assert (await h.webhook(body(alert(ruleloop_target="prod-a")))).status_code == 202
        await h.bot.tasks.drain()
    finally:
        await h.close()
    assert (configured / "ruleloop.db").is_file()
    charts = list((configured / "charts").glob("*.png"))
    assert charts and str(charts[0]) in h.console.getvalue()
    assert not (tmp_path / "state" / "charts").exists()  # the harness's --state-dir
    help_text = " ".join(CliRunner().invoke(cli, ["serve", "--help"]).output.split())
    assert "console charts go when [paths] state is unset" in help_text


def test_the_help_reads_the_same_once_a_command_was_imported() -> None:
    """The listing came from the table for unimported commands and from the docstring for
    imported ones: the help changed once any test (or a first run) had loaded `adr`."""
    before = CliRunner().invoke(cli, ["--help"]).output
    for name in COMMANDS:
        cli.get_command(click.Context(cli), name)  # imports and registers it
    assert CliRunner().invoke(cli, ["--help"]).output == before
