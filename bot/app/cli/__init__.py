"""The `ruleloop` command line: one group, one module per subcommand family.

Errors become output in exactly one place, ``ErrorBoundary.invoke``: a RuleloopError prints as
one line of advice with its exit code; anything else prints a correlation id that is also in
the log, never a traceback.
"""

from __future__ import annotations

import importlib
import logging

import click

from bot.kernel import RuleloopError
from bot.kernel.runtime import new_error_id

log = logging.getLogger("ruleloop")


class ErrorBoundary:
    """Mixin for click commands: known errors read as advice, unknown ones carry an id."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)  # type: ignore[misc]
        except RuleloopError as exc:
            click.secho(f"error: {exc}", err=True, fg="red")
            ctx.exit(exc.exit_code)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except BrokenPipeError:
            # The reader left (`ruleloop adr show ... | head -1`): click's main exits quietly.
            raise
        except Exception:
            error_id = new_error_id()
            where = _record_unexpected(error_id)
            click.secho(
                f"error: unexpected failure (id {error_id}); the details are in {where}",
                err=True,
                fg="red",
            )
            ctx.exit(2)


def _record_unexpected(error_id: str) -> str:
    """Append the current traceback to the error log under its id; return the log's path."""
    import traceback

    from bot.engine import default_state_dir

    path = default_state_dir() / "errors.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:
            fh.write(f"--- {error_id}\n{traceback.format_exc()}\n")
    except OSError:
        log.error("unexpected error %s", error_id, exc_info=True)
        return "the log (stderr)"
    return str(path)


class Group(ErrorBoundary, click.Group):
    """A click group behind the error boundary that imports subcommand modules on first use.

    `python -m latency_checker` and `ruleloop canary` should not pay for importing the bot,
    the gateway or vLLM's argument parser. Each module in ``lazy`` has ``register(group)``.
    The group's own help lists the lazy commands by their line in ``summaries`` without
    importing them (`ruleloop --help` would otherwise load matplotlib, Slack and the bot).
    """

    def __init__(
        self,
        *args: object,
        lazy: dict[str, str] | None = None,
        summaries: dict[str, str] | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = dict(lazy or {})
        self.summaries = dict(summaries or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their one line each, from ``summaries`` where it has one (so the help
        reads the same whether a command was imported yet or not), without importing it."""
        rows = []
        for name in self.list_commands(ctx):
            if name in self.summaries:
                rows.append((name, self.summaries[name]))
                continue
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(formatter.width - 6 - len(name))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = self.lazy.pop(cmd_name, None)
        if module is not None:
            importlib.import_module(module).register(self)
        return super().get_command(ctx, cmd_name)


class Command(ErrorBoundary, click.Command):
    """A click command behind the error boundary (for standalone entry points)."""


# Subcommand name -> the module that registers it.
COMMANDS = {
    "engine": "bot.app.cli.engine",
    "eval": "bot.app.cli.eval",
    "canary": "bot.app.cli.canary",
    "canary-live": "bot.app.cli.canary_live",
    "canary-schema": "bot.app.cli.canary",
    "demo": "bot.app.cli.demo",
    "gateway": "bot.app.cli.gateway",
    "adr": "bot.app.cli.adr",
    "tune": "bot.app.cli.tune",
    "serve": "bot.app.cli.serve",
    "page-link": "bot.app.cli.serve",
    "db": "bot.app.cli.db",
    "config": "bot.app.cli.config",
    "agent": "bot.app.cli.agent",
    "workload": "bot.app.cli.workload",
    "runbooks": "bot.app.cli.runbooks",
}
# Subcommand name -> its line in `ruleloop --help` (tests/test_cli_help.py keeps them in step).
SUMMARIES = {
    "adr": "The pre-approved fixes (ADRs): list, show, validate, match.",
    "agent": "Serve this host's GPU (NVML) snapshot to the bot over HTTP.",
    "canary": "Load an endpoint with streaming requests; check the gates.",
    "canary-live": "Judge a target's canary replicas against its baseline, live.",
    "canary-schema": "Print the JSON Schema of the canary report (--output-json).",
    "config": "The bot's settings (TOML file + environment).",
    "db": "The incident store: schema, undelivered messages, resend.",
    "demo": "The whole loop on a local CPU engine, incident to draft.",
    "engine": "Run a real vLLM engine locally (CPU, tiny dummy model).",
    "eval": "Grade the diagnosis on induced incidents (real local engines).",
    "gateway": "Serve an inference gateway: deadlines, token budgets.",
    "page-link": "Print a signed link to an incident's page (or the index).",
    "runbooks": "Check runbook files: readings, conditions, hypotheses' causes.",
    "serve": "Run the bot: Slack, Alertmanager intake, incident pages.",
    "tune": "Measure vLLM configurations (in turn, or a search); draft the ADR.",
    "workload": "Workload shapes: capture from /metrics, diff for drift.",
}


@click.group(
    cls=Group,
    lazy=COMMANDS,
    summaries=SUMMARIES,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="ruleloop")
def cli() -> None:
    """ruleloop: diagnose vLLM latency incidents, apply pre-approved ADR fixes behind a canary,
    and draft the next ADR from measured numbers.

    \b
    Start here:
      ruleloop engine up            start a local vLLM engine (tiny model, CPU)
      ruleloop canary --endpoint http://127.0.0.1:8000/v1/completions
      ruleloop demo                 the whole loop on a local engine: an incident, its
                                    diagnosis, the ADR applied behind a canary, the
                                    draft, and a workload drift re-validation
    """
    import os

    from bot.kernel.runtime import basic_logs

    # `ruleloop serve` puts its own in its place ([server] log_format, log_level)
    basic_logs(logging.DEBUG if os.environ.get("RULELOOP_DEBUG") else logging.WARNING)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="ruleloop")
