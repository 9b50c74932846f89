"""Who may request and approve a change, and which changes may be requested at all.

Fail closed: an empty access list means nobody. Only an `accepted` ADR is a pre-approved fix,
and only flags that pass the allowlist check reach an actuator. The two-person rule holds by
default: the approver must be someone other than the requester. ``[remediation]
allow_self_approval`` opts out, except for targets with ``two_person`` and the ADRs in
``two_person_adrs``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bot.adr import Adr, canonical, check_engine_args
from bot.change.argv import FlagValues
from bot.kernel import AccessSettings, NotAllowed, Settings, UsageError
from bot.kernel.runtime import who_may


@dataclass(frozen=True)
class ChangePlan:
    """A request that passed the policy: the ADR, the target and the flags to set."""

    adr: Adr
    target: str
    change: FlagValues
    two_person: bool


class Policy:
    """The checks every request and every approval passes before anything happens."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def check_request(
        self, *, user_id: str, adr: Adr, target: str, members: AccessSettings | None = None
    ) -> ChangePlan:
        """The plan for applying ``adr`` to ``target``; NotAllowed/UsageError says why not.

        ``members``: the access lists with user groups expanded (default: as configured).
        """
        access = self._settings.access
        if not (members or access).allows("apply", user_id):
            raise NotAllowed(
                f"You may not request ADR changes. Allowed: {who_may(access.apply)}. "
                "Nothing was changed."
            )
        if adr.status != "accepted":
            raise UsageError(
                f"{adr.id} is {adr.status}, not accepted: only accepted ADRs are pre-approved "
                "fixes. Review it first (its Accept button, or set `status: accepted` in git). "
                "Nothing was changed."
            )
        problems = check_engine_args(adr.fix.engine_args)
        if problems:
            field, why = problems[0]
            raise UsageError(f"{adr.id} cannot be applied: {field}: {why}. Nothing was changed.")
        if not adr.fix.engine_args and adr.fix.gateway is None:
            raise UsageError(
                f"{adr.id} sets no engine flags and no gateway rules: nothing to apply to {target}."
            )
        if adr.gates is None or adr.gates.is_empty():
            raise UsageError(
                f"{adr.id} has no gates, so a canary could not judge the change; add `gates:` "
                "to its front matter. Nothing was changed."
            )
        spec = self._settings.targets[target]
        rules = self._settings.remediation
        two_person = (
            not rules.allow_self_approval or spec.two_person or adr.id in rules.two_person_adrs
        )
        change = {canonical(k): v for k, v in adr.fix.engine_args.items()}
        return ChangePlan(adr=adr, target=target, change=change, two_person=two_person)

    def check_approval(
        self,
        *,
        user_id: str,
        requested_by: str,
        two_person: bool,
        adr_id: str,
        members: AccessSettings | None = None,
    ) -> None:
        """NotAllowed when ``user_id`` may not approve this request."""
        access = self._settings.access
        if not (members or access).allows("approve", user_id):
            raise NotAllowed(
                f"You may not approve changes. Approvers: {who_may(access.approve)}. "
                "Nothing was changed; the buttons still work for them."
            )
        if two_person and user_id == requested_by:
            raise NotAllowed(
                f"{adr_id} needs a second person: the requester cannot approve it "
                f"(two-person rule). Ask one of {who_may(access.approve)}. Nothing was changed."
            )

    def check_tuning(
        self, *, target: str, requested_by: str | None, approved_by: Sequence[str]
    ) -> list[str]:
        """The approvers of a tuning session on ``target`` (checked as an apply's request and
        approval are); NotAllowed/UsageError says who is missing.

        A session changes the target's flags trial by trial, so it is approved like an apply:
        the requester needs ``apply``, each approver ``approve``, and under the two-person rule
        (the default, and always on ``two_person`` targets) one approver who is not the
        requester. Without the two-person rule the requester approves their own session.
        """
        access = self._settings.access
        if not requested_by:
            raise UsageError(
                f"tuning {target} changes its flags trial by trial, so it is approved like an "
                "apply: name who asks (--requested-by, a Slack user ID in [access] apply) and "
                "who approves (--approved-by, in [access] approve). Nothing was changed."
            )
        if not access.allows("apply", requested_by):
            raise NotAllowed(
                f"{requested_by} may not request changes to {target}. Allowed: "
                f"{who_may(access.apply)}. Nothing was changed."
            )
        refused = [user for user in approved_by if not access.allows("approve", user)]
        if refused:
            raise NotAllowed(
                f"{', '.join(refused)} may not approve changes. Approvers: "
                f"{who_may(access.approve)}. Nothing was changed."
            )
        spec = self._settings.targets[target]
        two_person = not self._settings.remediation.allow_self_approval or spec.two_person
        others = sorted({user for user in approved_by if user != requested_by})
        if two_person and not others:
            raise NotAllowed(
                f"tuning {target} needs a second person (two-person rule): add --approved-by "
                f"with one of {who_may(access.approve)} other than {requested_by}. Nothing was "
                "changed."
            )
        return others if two_person else sorted({*approved_by} or {requested_by})

    def check_cancel(
        self, *, user_id: str, requested_by: str, members: AccessSettings | None = None
    ) -> None:
        """The requester or any approver may cancel a pending request."""
        access = members or self._settings.access
        if user_id != requested_by and not access.allows("approve", user_id):
            raise NotAllowed(
                "Only the requester or an approver may cancel this request. Nothing was changed."
            )
