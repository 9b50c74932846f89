"""What every room stands on; nothing here imports a room above it.

chat/          Slack's wire format every room that writes to a thread shares
numbers/       what a number is (a value or a histogram bound) and the one way it is written
store/         SQLAlchemy models, migrations, and the persistence the rooms share
runtime/       plumbing: supervised tasks, the bot's metrics, ids, the SSE parser, defaults
listening.py   binding a listening socket
config.py      settings (TOML and environment), validated by pydantic
errors.py      the error tree every room raises, each error with what to do
lazy.py        a package's face: what other rooms may import from it, loaded on first use
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel.lazy import face_of

if TYPE_CHECKING:
    from bot.kernel.config import CONFIG_ENV as CONFIG_ENV
    from bot.kernel.config import ENV_KEYS as ENV_KEYS
    from bot.kernel.config import POD_NETWORKS as POD_NETWORKS
    from bot.kernel.config import AccessSettings as AccessSettings
    from bot.kernel.config import AdrPublishSettings as AdrPublishSettings
    from bot.kernel.config import ArgoCdSyncSpec as ArgoCdSyncSpec
    from bot.kernel.config import CanarySpec as CanarySpec
    from bot.kernel.config import FluxSyncSpec as FluxSyncSpec
    from bot.kernel.config import ForgeSpec as ForgeSpec
    from bot.kernel.config import GitActuatorSpec as GitActuatorSpec
    from bot.kernel.config import GitLocatorSpec as GitLocatorSpec
    from bot.kernel.config import GitRepoSpec as GitRepoSpec
    from bot.kernel.config import KubernetesActuatorSpec as KubernetesActuatorSpec
    from bot.kernel.config import KubernetesApiSpec as KubernetesApiSpec
    from bot.kernel.config import LiveStage as LiveStage
    from bot.kernel.config import LocalActuatorSpec as LocalActuatorSpec
    from bot.kernel.config import ScheduledTarget as ScheduledTarget
    from bot.kernel.config import Settings as Settings
    from bot.kernel.config import SilenceSpec as SilenceSpec
    from bot.kernel.config import SlackSettings as SlackSettings
    from bot.kernel.config import Target as Target
    from bot.kernel.config import TracingSettings as TracingSettings
    from bot.kernel.config import WebSettings as WebSettings
    from bot.kernel.errors import AdrError as AdrError
    from bot.kernel.errors import EndpointError as EndpointError
    from bot.kernel.errors import EngineError as EngineError
    from bot.kernel.errors import GateFailed as GateFailed
    from bot.kernel.errors import NotAllowed as NotAllowed
    from bot.kernel.errors import ProbeError as ProbeError
    from bot.kernel.errors import RequestRejected as RequestRejected
    from bot.kernel.errors import RuleloopError as RuleloopError
    from bot.kernel.errors import UnknownAdr as UnknownAdr
    from bot.kernel.errors import UsageError as UsageError
    from bot.kernel.listening import QuietServer as QuietServer
    from bot.kernel.listening import bind as bind

__all__ = [
    "AccessSettings",
    "AdrError",
    "AdrPublishSettings",
    "ArgoCdSyncSpec",
    "CONFIG_ENV",
    "CanarySpec",
    "ENV_KEYS",
    "EndpointError",
    "EngineError",
    "FluxSyncSpec",
    "ForgeSpec",
    "GateFailed",
    "GitActuatorSpec",
    "GitLocatorSpec",
    "GitRepoSpec",
    "KubernetesActuatorSpec",
    "KubernetesApiSpec",
    "LiveStage",
    "LocalActuatorSpec",
    "NotAllowed",
    "POD_NETWORKS",
    "ProbeError",
    "QuietServer",
    "RequestRejected",
    "RuleloopError",
    "ScheduledTarget",
    "Settings",
    "SilenceSpec",
    "SlackSettings",
    "Target",
    "TracingSettings",
    "UnknownAdr",
    "UsageError",
    "WebSettings",
    "bind",
    "face_of",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
