"""The actuator registry (bot/change/actuators/__init__.py): one actuator per kind the
config accepts, built from the target's spec; a target without one is refused with the kinds."""

from __future__ import annotations

import typing

import pytest

from bot.change import actuators
from bot.change.actuators.dry_run import DryRunActuator
from bot.change.actuators.local import LocalActuator
from bot.kernel.config import ActuatorSpec, Target
from bot.kernel.errors import UsageError


def config_kinds() -> list[str]:
    """The ``kind`` of every actuator spec the config's union accepts, in its order."""
    (union, *_) = typing.get_args(ActuatorSpec)
    return [
        k
        for spec in typing.get_args(union)
        for k in typing.get_args(spec.model_fields["kind"].annotation)
    ]


def test_every_kind_the_config_accepts_has_an_actuator_and_no_other() -> None:
    assert config_kinds() == list(actuators.ACTUATORS) == ["local", "kubernetes", "git", "dry-run"]


@pytest.mark.parametrize(("kind", "built"), [("local", LocalActuator), ("dry-run", DryRunActuator)])
def test_a_target_gets_the_actuator_of_its_kind(kind: str, built: type) -> None:
    target = Target.model_validate({"vllm_url": "http://10.0.0.5:8000", "actuator": {"kind": kind}})
    assert type(actuators.build("prod-a", target)) is built


def test_a_target_without_an_actuator_is_refused_with_the_kinds_to_choose() -> None:
    with pytest.raises(UsageError) as caught:
        actuators.build("prod-a", Target(vllm_url="http://10.0.0.5:8000"))
    assert str(caught.value) == (
        "target 'prod-a' has no actuator, so ruleloop cannot change it; configure "
        '[targets.prod-a.actuator] kind = "local" | "kubernetes" | "git" | "dry-run"'
    )
