"""The `ruleloop` command line: one group, one module per subcommand family.

Errors become output in exactly one place, ``ErrorBoundary.invoke``: a RuleloopError prints as
one line of advice with its exit code; anything else prints a correlation id that is also in
the log, never a traceback.
"""

from __future__ import annotations

import logging
import uuid

import click

from bot.errors import RuleloopError

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
        except Exception:
            error_id = uuid.uuid4().hex[:8]
            log.exception("unexpected error %s", error_id)
            click.secho(
                f"error: unexpected failure (id {error_id}); rerun with RULELOOP_DEBUG=1 "
                "for details and report the id",
                err=True,
                fg="red",
            )
            ctx.exit(2)


class Group(ErrorBoundary, click.Group):
    """A click group behind the error boundary."""


class Command(ErrorBoundary, click.Command):
    """A click command behind the error boundary (for standalone entry points)."""


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ruleloop")
def cli() -> None:
    """ruleloop: diagnose vLLM latency incidents, apply pre-approved ADR fixes behind a canary,
    and draft the next ADR from measured numbers.

    \b
    Start here:
      ruleloop engine up            start a local vLLM engine (tiny model, CPU)
      ruleloop canary --endpoint http://127.0.0.1:8000/v1/completions
      ruleloop demo                 both, and print the four-metric baseline
    """
    import os

    level = logging.DEBUG if os.environ.get("RULELOOP_DEBUG") else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _register() -> None:
    from bot.cli import adr, canary, demo, engine, gateway, tune

    for module in (engine, canary, demo, gateway, adr, tune):
        module.register(cli)


_register()


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="ruleloop")
