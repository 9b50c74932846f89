"""The bot's log as a log collector reads it: ``[server] log_format = "json"`` writes one JSON
object per line, and every line written while an incident or a change is worked on names it
(``incident_id``, ``change_id``), from ContextVars (bot/kernel/runtime/logs.py).

The incident and the remediation run on the real bot (tests/fakes/bot.py: Slack faked at the
wire), through the handler ``ruleloop serve`` installs; ``ruleloop serve`` itself is started
in-process on a busy port (it stops at the bind, after its first log line).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import socket
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bot.app.cli import cli
from bot.kernel.runtime import configured_logs, log_ids
from tests.fakes.alerts import alert, body
from tests.fakes.bot import harness
from tests.fakes.slack_api import FakeSlack
from tests.fakes.sse_engine import SseEngine
from tests.test_hold_for_a_person import make
from tests.test_standing_guardrails import ADR

log = logging.getLogger("ruleloop.test")


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    """Every line written, each parsed as one JSON object (a line that is not fails the test)."""
    text = stream.getvalue()
    assert text.endswith("\n") and text.strip(), text
    parsed = [json.loads(line) for line in text.splitlines()]
    for line in parsed:
        assert {"level", "logger", "message", "time"} <= set(line), line
    return parsed


async def test_an_incident_opened_by_alertmanager_logs_json_lines_with_its_id(
    tmp_path: Path, slack: FakeSlack
) -> None:
    out = io.StringIO()
    h = harness(tmp_path, slack=slack)
    try:
        with configured_logs("json", "info", stream=out):
            opened = await h.webhook(body(alert()))
            incident = opened.json()["incident"]
            await slack.until("chat.update")
            await h.bot.tasks.drain()
            log.info("after the incident's work")  # no incident in force here
    finally:
        await h.close()
    written = lines(out)
    about = [line for line in written if f"incident {incident}" in line["message"]]
    assert {line["logger"] for line in about} >= {"ruleloop.server", "ruleloop.outbox"}, written
    assert all(line.get("incident_id") == incident for line in about), about
    delivered = [line["message"] for line in about if line["logger"] == "ruleloop.outbox"]
    assert f"incident {incident}: root delivered" in delivered, delivered
    assert f"incident {incident}: update delivered" in delivered  # the diagnosis
    assert any(m.startswith(f"incident {incident}: diagnosis posted ") for m in delivered)
    (webhook,) = [line for line in about if line["logger"] == "ruleloop.server"]
    assert webhook["message"] == f"alertmanager: incident {incident} opened"
    assert webhook["outcome"] == "opened"  # an extra= of the call is a field of its own
    (last,) = [line for line in written if line["message"] == "after the incident's work"]
    assert "incident_id" not in last and last["level"] == "INFO"  # ids do not leak out


@pytest.fixture
async def engine():  # noqa: ANN201
    async with SseEngine() as served:
        yield served


async def test_a_remediation_logs_each_step_with_its_change_and_incident(
    tmp_path: Path, slack: FakeSlack, engine: SseEngine
) -> None:
    out = io.StringIO()
    h = make(tmp_path, slack, engine, limit=1)  # the canary misses TTFT p99 <= 1 ms
    try:
        with configured_logs("json", "info", stream=out):
            await h.bot.remediation.request(user_id="U1", adr_id=ADR, target="prod-a")
            rem = await h.approve_change()
    finally:
        await h.close()
    assert rem.state == "rolled_back", rem.result
    steps = [line for line in lines(out) if line["logger"] == "ruleloop.remediation"]
    said = [line["message"] for line in steps]
    for action in ("remediation.approved", "remediation.applying", "remediation.rolling_back",
                   "remediation.rolled_back"):  # fmt: skip
        assert any(f"remediation {rem.id}: {action} " in m for m in said), said
    assert all(line.get("change_id") == rem.id for line in steps), steps
    assert all(line.get("incident_id") == rem.incident_id for line in steps), steps


async def test_concurrent_incidents_keep_their_own_ids() -> None:
    """Two incidents worked on at once in one event loop: each line names its own (a global
    would name the last one set on every line)."""
    out = io.StringIO()

    async def work(incident_id: int, change_id: int | None) -> None:
        with log_ids(incident_id=incident_id, change_id=change_id):
            for step in range(3):
                log.info("work %s step %s", incident_id, step)
                await asyncio.sleep(0)
                await asyncio.to_thread(log.info, "work %s in a thread", incident_id)

    with configured_logs("json", "info", stream=out):
        await asyncio.gather(work(7, 3), work(8, None))
    written = lines(out)
    assert len(written) == 12
    for line in written:
        own = int(line["message"].split()[1])
        assert line["incident_id"] == own, line
        assert line.get("change_id") == (3 if own == 7 else None), line


def test_text_is_the_default_and_names_the_ids_too() -> None:
    out = io.StringIO()
    with configured_logs("text", "info", stream=out):
        with log_ids(incident_id=7, change_id=3):
            log.warning("rolled back")
        log.info("idle")
        logging.getLogger("httpx").info("a library's info line is not shown")
        logging.getLogger("httpx").warning("its warnings are")
    first, second, third = out.getvalue().splitlines()
    assert first.endswith(" WARNING ruleloop.test: rolled back [incident 7 change 3]"), first
    assert second.endswith(" INFO ruleloop.test: idle"), second
    assert third.endswith(" WARNING httpx: its warnings are"), third


def test_the_level_and_the_handler_are_given_back_after() -> None:
    root, own = logging.getLogger(), logging.getLogger("ruleloop")
    before = (root.level, own.level, list(root.handlers))
    with configured_logs("json", "warning", stream=io.StringIO()) as handler:
        assert handler in root.handlers and own.level == logging.WARNING
        assert not logging.getLogger("ruleloop.flows").isEnabledFor(logging.INFO)
    assert (root.level, own.level, list(root.handlers)) == before


def serve_once(tmp_path: Path, *, env: dict[str, str] | None = None, server: str = "") -> str:
    """`ruleloop serve` on a busy port with nobody to review drafts: it logs that warning,
    then stops at the bind (exit 2); what it wrote on stderr."""
    path = tmp_path / "ruleloop.toml"
    path.write_text(f'{server}[access]\napply = ["U1"]\n')
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(
            cli, ["serve", "--config", str(path), "--port", str(port)], env=env
        )
    assert result.exit_code == 2, result.output
    return result.stderr


@pytest.mark.parametrize(
    ("env", "server"),
    [({"RULELOOP_LOG_FORMAT": "json"}, ""), (None, '[server]\nlog_format = "json"\n')],
    ids=["env", "toml"],
)
def test_serve_writes_json_lines_when_asked(
    tmp_path: Path, env: dict[str, str] | None, server: str
) -> None:
    stderr = serve_once(tmp_path, env=env, server=server)
    logged = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    (warning,) = [line for line in logged if line["logger"] == "bot.app.cli.serve"]
    assert warning["level"] == "WARNING"
    assert warning["message"].startswith("nobody can accept a draft ADR"), warning


def test_serve_writes_text_by_default(tmp_path: Path) -> None:
    stderr = serve_once(tmp_path)
    assert " WARNING bot.app.cli.serve: nobody can accept a draft ADR" in stderr, stderr
    assert not any(line.startswith("{") for line in stderr.splitlines()), stderr
