"""Actuators: local engine processes, a Kubernetes Deployment, a commit to the deployment
repository (git: Argo CD / Flux deploy it), or a dry run (``build``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from bot.config import (
    DryRunActuatorSpec,
    GitActuatorSpec,
    KubernetesActuatorSpec,
    LocalActuatorSpec,
    Target,
)
from bot.errors import UsageError
from bot.remediation.actuators.base import Actuator

log = logging.getLogger("ruleloop.remediation")
ActuatorFactory = Callable[[str, Target], Actuator]


def build(name: str, target: Target) -> Actuator:
    """The actuator configured for a target; UsageError when it has none."""
    spec = target.actuator
    if isinstance(spec, LocalActuatorSpec):
        from bot.remediation.actuators.local import LocalActuator

        return LocalActuator(spec, vllm_url=target.vllm_url)
    if isinstance(spec, KubernetesActuatorSpec):
        from bot.remediation.actuators.kubernetes import KubernetesActuator

        return KubernetesActuator(spec, vllm_url=target.vllm_url)
    if isinstance(spec, GitActuatorSpec):
        from bot.remediation.actuators.git import GitActuator

        return GitActuator(spec, target=name, vllm_url=target.vllm_url)
    if isinstance(spec, DryRunActuatorSpec):
        from bot.remediation.actuators.dry_run import DryRunActuator

        return DryRunActuator(vllm_url=target.vllm_url)
    raise UsageError(
        f"target {name!r} has no actuator, so ruleloop cannot change it; configure "
        f'[targets.{name}.actuator] kind = "local" | "kubernetes" | "git" | "dry-run"'
    )


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
