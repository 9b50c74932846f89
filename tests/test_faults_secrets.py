"""Item 6 of the reliability faults: no argv secret in the append-only audit log (or anywhere).

With `--api-key sk-...` in a Deployment's args, the `remediation.requested` audit entry and the
rollback-mismatch card note carried the key, and the audit log cannot be scrubbed. Now only the
tunable flags (the allowlist) and a hash of the argv are kept; other arguments' values are never
written, posted or logged. The Kubernetes API is the fake at the wire.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from bot.change.argv import read_flags
from bot.kernel.errors import EndpointError
from tests.fakes.bot import Harness, harness
from tests.fakes.clock import FakeTime
from tests.fakes.kube_api import FakeKube, KubeActuators
from tests.fakes.slack_api import FakeSlack
from tests.fakes.sse_engine import SseEngine
from tests.test_remediation_slack import ADR, buttons, remediations

pytestmark = pytest.mark.faults
SECRET = "sk-secret"
ARGS = ["--model", "/models/llama-3-8b", "--api-key", SECRET, "--max-num-seqs", "256",
        f"--hf-token={SECRET}-2", "--max-num-batched-tokens", "8192"]  # fmt: skip


@pytest.fixture
def kube() -> FakeKube:
    fake = FakeKube()
    fake.add_deployment("vllm", args=ARGS, replicas=2)
    return fake


@pytest.fixture
async def h(
    tmp_path: Path, slack: FakeSlack, kube: FakeKube, caplog: pytest.LogCaptureFixture
) -> AsyncIterator[Harness]:
    caplog.set_level(logging.DEBUG)
    clock = FakeTime()
    actuator_for = KubeActuators(kube, clock)

    async def canary_cannot_run(*args: object, **kwargs: object) -> Any:
        raise EndpointError("the canary could not reach the engine")

    async with SseEngine() as engine:  # serves the completion the rollback verifies
        spec = {"kind": "kubernetes", "namespace": "inference", "deployment": "vllm",
                "token_file": None, "ca_file": None, "poll_interval_s": 1.0}  # fmt: skip
        harness_ = harness(
            tmp_path, slack=slack,
            targets={"prod-a": {"vllm_url": engine.base_url, "actuator": spec}},
            bot_options={"actuator_for": actuator_for, "gate": canary_cannot_run},
        )  # fmt: skip
        yield harness_
        await harness_.close()
    await actuator_for.aclose()


async def change_and_roll_back(h: Harness, slack: FakeSlack) -> str:
    """Request, approve and run the change; the canary cannot run, so it is rolled back.
    The card's last text."""
    assert (await h.slash(f"{ADR} prod-a", command="/apply-adr")).text == ""  # acked at once
    (reply,) = await slack.until("response_url")  # then answered: where the card is
    assert reply.args["text"].startswith(f"{ADR} on prod-a: the confirmation card"), reply.args
    await h.bot.tasks.drain()
    card = [c for c in slack.of("chat.postMessage") if buttons(c)][-1]
    await h.click(buttons(card)["remediation_approve"], user="U2", action_id="remediation_approve")
    await h.bot.tasks.drain()
    return json.dumps(slack.of("chat.update")[-1].args)


def assert_secret_nowhere(h: Harness, slack: FakeSlack, caplog: pytest.LogCaptureFixture) -> None:
    """Not in any row of any table (the audit log first), any Slack call, any log record."""
    with h.bot.db.engine.connect() as connection:

        def rows(table: str) -> list[str]:  # every column in full (a Row's str() clips them)
            query = text(f"SELECT * FROM {table}")
            return [" ".join(map(str, row)) for row in connection.execute(query)]

        audit = rows("audit_log")
        assert any("remediation.requested" in row for row in audit)
        assert not [row for row in audit if SECRET in row]
        for table in ("changes", "incidents", "canary_results", "action_tokens"):
            assert not [row for row in rows(table) if SECRET in row], table
    calls = [json.dumps(c.args) + repr(c.body) for c in slack.calls]
    assert calls and not [c for c in calls if SECRET in c]
    logged = [r.getMessage() + (caplog.text if r.exc_info else "") for r in caplog.records]
    assert not [m for m in logged if SECRET in m]
    assert SECRET not in caplog.text


async def test_no_argv_secret_in_the_audit_log_slack_or_logs_through_a_rollback(
    h: Harness, slack: FakeSlack, kube: FakeKube, caplog: pytest.LogCaptureFixture
) -> None:
    last = await change_and_roll_back(h, slack)
    (rem,) = remediations(h)
    assert rem.state == "rolled_back", last
    assert kube.args("vllm") == ARGS  # the rollback still restored every argument exactly
    assert [p.body["spec"]["template"]["spec"]["containers"][0]["args"] for p in kube.patches()][
        -1
    ] == ARGS
    assert rem.before["flags"] == {"max-num-seqs": 256, "max-num-batched-tokens": 8192}
    assert_secret_nowhere(h, slack, caplog)


async def test_a_rollback_mismatch_names_no_argv_secret(
    h: Harness, slack: FakeSlack, kube: FakeKube, caplog: pytest.LogCaptureFixture
) -> None:
    """An admission webhook adds an argument to every patch: the rolled-back args are not the
    recorded ones. The card says so, with the tunable flags and the argv's hash only."""

    def webhook_adds_a_seed(obj: dict[str, Any]) -> None:
        obj["spec"]["template"]["spec"]["containers"][0]["args"].append("--seed=0")

    kube.admission.append(webhook_adds_a_seed)
    last = await change_and_roll_back(h, slack)
    assert_secret_nowhere(h, slack, caplog)
    (rem,) = remediations(h)
    assert rem.state == "failed", last
    assert "ROLLBACK FAILED" in last and "other arguments" in last and "sha256" in last, last
    assert "--max-num-batched-tokens=8192 --max-num-seqs=256" in last  # the flags to check
    args = kube.args("vllm")
    assert args.count("--api-key") == 1 and SECRET in args  # the engine keeps its key
    assert read_flags(args) == rem.before["flags"]  # the tunable flags were put back
