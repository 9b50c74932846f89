"""Actuators: local engine processes, a Kubernetes Deployment, a commit to the deployment
repository (git: Argo CD / Flux deploy it), or a dry run (``build``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from bot.change.actuators.base import Actuator
from bot.kernel import (
    GitActuatorSpec,
    KubernetesActuatorSpec,
    LocalActuatorSpec,
    Target,
    UsageError,
    face_of,
)

if TYPE_CHECKING:
    from bot.change.actuators.base import ActuatorError as ActuatorError
    from bot.change.actuators.base import ChangeContext as ChangeContext
    from bot.change.actuators.base import Deployed as Deployed
    from bot.change.actuators.base import TakesContext as TakesContext

__all__ = [
    "ACTUATORS",
    "Actuator",
    "ActuatorError",
    "ActuatorFactory",
    "ChangeContext",
    "Deployed",
    "TakesContext",
    "build",
    "opened",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)

log = logging.getLogger("ruleloop.remediation")
ActuatorFactory = Callable[[str, Target], Actuator]


def _local(name: str, target: Target) -> Actuator:
    from bot.change.actuators.local import LocalActuator

    assert isinstance(target.actuator, LocalActuatorSpec)
    return LocalActuator(target.actuator, vllm_url=target.vllm_url)


def _kubernetes(name: str, target: Target) -> Actuator:
    from bot.change.actuators.kubernetes import KubernetesActuator

    assert isinstance(target.actuator, KubernetesActuatorSpec)
    return KubernetesActuator(target.actuator, vllm_url=target.vllm_url)


def _git(name: str, target: Target) -> Actuator:
    from bot.change.actuators.git import GitActuator

    assert isinstance(target.actuator, GitActuatorSpec)
    return GitActuator(target.actuator, target=name, vllm_url=target.vllm_url)


def _dry_run(name: str, target: Target) -> Actuator:
    from bot.change.actuators.dry_run import DryRunActuator

    return DryRunActuator(vllm_url=target.vllm_url)


# The actuators by their config's ``kind``, as the probes are by name
# (bot/diagnosis/runbooks/registry.py).
# Each one's module is imported only when a target uses it (Kubernetes' and git's are heavy).
ACTUATORS: dict[str, ActuatorFactory] = {
    "local": _local,
    "kubernetes": _kubernetes,
    "git": _git,
    "dry-run": _dry_run,
}


def build(name: str, target: Target) -> Actuator:
    """The actuator configured for a target; UsageError when it has none."""
    factory = ACTUATORS.get(target.actuator.kind) if target.actuator is not None else None
    if factory is None:
        kinds = " | ".join(f'"{kind}"' for kind in ACTUATORS)
        raise UsageError(
            f"target {name!r} has no actuator, so ruleloop cannot change it; configure "
            f"[targets.{name}.actuator] kind = {kinds}"
        )
    return factory(name, target)


@contextlib.asynccontextmanager
async def opened(
    actuator_for: ActuatorFactory, name: str, target: Target
) -> AsyncIterator[Actuator]:
    """One actuator for one change (or one look at what serves), closed when it ends: a
    failure to close is logged, never the change's outcome."""
    actuator = actuator_for(name, target)
    try:
        yield actuator
    finally:
        try:
            await actuator.aclose()
        except Exception:
            log.warning("closing the %s actuator of %s failed", actuator.kind, name, exc_info=True)
