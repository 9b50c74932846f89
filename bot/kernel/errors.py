"""The errors ruleloop raises on purpose, and the exit code each one means.

    RuleloopError (exit 2)            anything the user can act on; message reads as advice
    ├── UsageError (exit 2)           bad flags, bad values, bad files
    │   ├── AdrError (exit 2)         an ADR file breaks the format or a rule (file, field, why)
    │   ├── RequestRejected (exit 2)  an inbound webhook is refused (carries its HTTP status)
    │   │   └── Unreadable            a Slack body of a shape bolt cannot read (slack/shapes.py)
    │   ├── UnknownAdr (exit 2)       no ADR has this id (chat_text: without server paths)
    │   ├── NotAllowed (exit 2)       a Slack user may not do this; says who may
    │   ├── NoNormal                  a relative value with no normal measured (adr/relative.py)
    │   ├── ShapeError                a workload shape file is wrong (workload/shape.py)
    │   ├── AlreadyDecided            a draft someone else decided first (postmortem/records.py)
    │   └── TargetBusy                a change runs on the target already (change/exclusion.py)
    ├── EndpointError (exit 2)        a server cannot be reached or does not speak the protocol
    │   ├── ProbeError (exit 2)       a /metrics page or other probe source is unusable
    │   ├── DeliveryFailed            Slack did not take a message; retry or not (chat/failures.py)
    │   └── SilenceError              Alertmanager did not create or expire a silence
    │                                 (remediation/silences.py)
    ├── EngineError (exit 2)          the local vLLM engine failed to start or stop
    ├── LoadFailed                    an eval scenario's engine did not serve its load
    │   │                             (eval/load.py)
    │   └── Refused                   the engine refused a request at admission (its queue)
    ├── ActuatorError                 a change could not be made or did not become healthy
    │   │                             (change/actuators/base.py)
    │   └── LocatorError              a git locator does not find the flags in its YAML file
    │                                 (change/actuators/yaml_flags.py)
    ├── GitOpsError                   git, the forge or a repository file did not do what was
    │   │                             needed (gitops/errors.py)
    │   └── GitConflict               someone else changed it first; nothing was left behind
    ├── RestoreFailed                 a tuning session could not put the target's flags back:
    │                                 manual action (tune/on_target.py)
    ├── ColdEngine                    the engine still warms up: no normal (scheduler/snapshots.py)
    ├── DemoFailed (exit 1)           `ruleloop demo` did not close the loop here (demo/scenario.py)
    ├── BelowGrade (exit 1)           `ruleloop eval`'s mean grade is under --min-grade
    │                                 (cli/eval.py)
    └── GateFailed (exit 1)           the canary measured numbers outside an ADR's gates

Errors defined beside their users are named with their module; a test keeps this tree whole.

Library errors (httpx, yaml, pydantic) are translated into these at one boundary per module
(``raise EndpointError(...) from exc``); the CLI's ``main`` is the one place that prints them.
"""

from __future__ import annotations


class RuleloopError(Exception):
    """Base class: an error whose message is meant for the person running ruleloop."""

    exit_code = 2


class UsageError(RuleloopError):
    """The command line, a value or an input file is wrong."""


class AdrError(UsageError):
    """An ADR is malformed or breaks a rule; the message names the file, the field and why."""

    def __init__(self, why: str, *, file: str | None = None, field: str | None = None) -> None:
        self.why, self.file, self.field = why, file, field
        where = ": ".join(part for part in (file, field) if part)
        super().__init__(f"{where}: {why}" if where else why)


class EndpointError(RuleloopError):
    """A server is unreachable or does not behave like the one expected."""


class ProbeError(EndpointError):
    """A probe source (a /metrics page, NVML) cannot be read or is not what it should be."""


class EngineError(RuleloopError):
    """The local vLLM engine could not be started, reached or stopped.

    ``refused`` is True when vLLM itself exited before serving (its verdict on the flags, with
    its own ``reason``), False when it merely did not become ready in time or was not there.
    """

    def __init__(self, message: str, *, refused: bool = False, reason: str | None = None) -> None:
        super().__init__(message)
        self.refused = refused
        self.reason = reason


class GateFailed(RuleloopError):
    """A canary gate was not met."""

    exit_code = 1


class RequestRejected(UsageError):
    """An inbound request (a webhook) is refused; ``status`` is the HTTP status to answer."""

    def __init__(self, why: str, *, status: int = 400) -> None:
        self.status = status
        super().__init__(why)


class UnknownAdr(UsageError):
    """No ADR has this id. The message names where the CLI looked; ``chat_text`` (for Slack)
    names only the id and the known ones: a chat user is not shown the server's paths."""

    def __init__(self, adr_id: str, *, known: list[str], where: str) -> None:
        self.adr_id, self.known = adr_id, known
        super().__init__(f"no ADR {adr_id} under {where} (known: {self._known()})")

    def _known(self) -> str:
        return ", ".join(self.known) or "none"

    def chat_text(self) -> str:
        """The message for a chat user."""
        return (
            f"no ADR {self.adr_id} (known: {self._known()}); `ruleloop adr list` on the bot's "
            "host lists them."
        )


class NotAllowed(UsageError):
    """The person asking is not configured to do this; the message says who is."""
