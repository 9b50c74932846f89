"""The incident store: incidents, alerts, their Slack messages and an append-only audit log."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.kernel import face_of

if TYPE_CHECKING:
    from bot.kernel.store.buttons import subject_key as subject_key
    from bot.kernel.store.db import MIGRATIONS as MIGRATIONS
    from bot.kernel.store.db import Database as Database
    from bot.kernel.store.dbtime import db_ago as db_ago
    from bot.kernel.store.dbtime import db_now as db_now
    from bot.kernel.store.leases import DONE as DONE
    from bot.kernel.store.leases import FAILED as FAILED
    from bot.kernel.store.leases import Claim as Claim
    from bot.kernel.store.leases import LeaseLost as LeaseLost
    from bot.kernel.store.leases import Leases as Leases
    from bot.kernel.store.leases import period_start as period_start
    from bot.kernel.store.models import ActionToken as ActionToken
    from bot.kernel.store.models import AdrDraft as AdrDraft
    from bot.kernel.store.models import AdrRecord as AdrRecord
    from bot.kernel.store.models import Alert as Alert
    from bot.kernel.store.models import AuditEntry as AuditEntry
    from bot.kernel.store.models import CanaryResult as CanaryResult
    from bot.kernel.store.models import CauseFeedback as CauseFeedback
    from bot.kernel.store.models import Change as Change
    from bot.kernel.store.models import DriftBeforeRun as DriftBeforeRun
    from bot.kernel.store.models import Incident as Incident
    from bot.kernel.store.models import JobRun as JobRun
    from bot.kernel.store.models import OutboxItem as OutboxItem
    from bot.kernel.store.models import Remediation as Remediation
    from bot.kernel.store.models import SlackReplay as SlackReplay
    from bot.kernel.store.models import TuneSession as TuneSession
    from bot.kernel.store.readings import ROLLBACK_FAILED as ROLLBACK_FAILED
    from bot.kernel.store.readings import StoreReading as StoreReading
    from bot.kernel.store.readings import read_store as read_store
    from bot.kernel.store.states import ACTIVE as ACTIVE
    from bot.kernel.store.states import HOLDS as HOLDS
    from bot.kernel.store.states import TUNING as TUNING
    from bot.kernel.store.states import ChangeKind as ChangeKind
    from bot.kernel.store.states import ChangeState as ChangeState
    from bot.kernel.store.summary import DiagnosisSummary as DiagnosisSummary
    from bot.kernel.store.summary import ReplicaRule as ReplicaRule
    from bot.kernel.store.summary import StoredFleet as StoredFleet
    from bot.kernel.store.summary import StoredReplica as StoredReplica

__all__ = [
    "ACTIVE",
    "ActionToken",
    "AdrDraft",
    "AdrRecord",
    "Alert",
    "AuditEntry",
    "CanaryResult",
    "CauseFeedback",
    "Change",
    "ChangeKind",
    "ChangeState",
    "Claim",
    "DONE",
    "Database",
    "DiagnosisSummary",
    "ReplicaRule",
    "StoredFleet",
    "StoredReplica",
    "DriftBeforeRun",
    "FAILED",
    "HOLDS",
    "Incident",
    "JobRun",
    "LeaseLost",
    "Leases",
    "MIGRATIONS",
    "OutboxItem",
    "ROLLBACK_FAILED",
    "Remediation",
    "SlackReplay",
    "StoreReading",
    "TUNING",
    "TuneSession",
    "adrs",
    "buttons",
    "db_ago",
    "db_now",
    "outbox",
    "period_start",
    "read_store",
    "service",
    "subject_key",
]

if not TYPE_CHECKING:
    __getattr__ = face_of(__name__, __file__)
