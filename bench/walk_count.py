"""How long the /apply-adr walk is: functions, modules and calls of bot/ from the slash command
to the post-incident draft, and how often the change's ADR is read.

    python bench/walk_count.py [--json] [--list]

Two walks: /apply-adr to the post-incident draft, and an Alertmanager notification to its
posted diagnosis.

Drives one change in this process the way the tests do: the real bot (create_bot, SQLite),
signed Slack requests through the route and the slack-bolt app, the fake Slack Web API at the
wire (tests/fakes/slack_api.py), the real Kubernetes actuator against the fake API server
(tests/fakes/kube_api.py) and a canary gate that judges a recorded report with the real judge
(bot.canary.verdict.judged), as tests/test_faults_heartbeat.py does. Steps: `/apply-adr
ADR-20260831-01 prod-a` (acked; the card posted), an Approve click by another approver, then
the run (apply, canary, verdict, promote) and the post-incident ADR draft it leaves.

Counted with sys.setprofile (and threading.setprofile, for the work sent off the loop), only
frames whose file is under bot/:
  functions  distinct functions entered;
  modules    distinct files they are in;
  calls      entries into them (a coroutine resumed after an await is not a new call);
  adr_reads  the ADR store read for a record: calls of SharedAdrStore.find (each stats the adr
             directory for changed files and reads the database), by the bot function that asked;
  checks     how often the two Slack requests' signatures and body shapes were checked, and the
             ADR's gates checked like for like;
  transactions  store transactions opened (bot.kernel.store.db.Database.transaction);
  change_reads  SQL reads of the change's row (SELECTs from the changes table);
  row_reads     every SELECT, by the table it reads first;
  card_renders  the card's view built (bot.remediation.card.Card.view).
A bot's start (create_bot, the store's first import of adr/) is outside the count.
No timings: the counts are the same on every machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dis
import json
import re
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import event, select  # noqa: E402

from bot.adr.models import AdrGates  # noqa: E402
from bot.canary.verdict import gates_from, judged  # noqa: E402
from bot.kernel.config import CanarySpec  # noqa: E402
from bot.kernel.store.models import AdrDraft, Remediation  # noqa: E402
from bot.remediation.gate import GateRun  # noqa: E402
from tests.fakes.alerts import alert  # noqa: E402
from tests.fakes.alerts import body as alert_body  # noqa: E402
from tests.fakes.bot import Harness, harness  # noqa: E402
from tests.fakes.clock import FakeTime  # noqa: E402
from tests.fakes.kube_api import FakeKube, KubeActuators  # noqa: E402
from tests.fakes.slack_api import FakeSlack  # noqa: E402

BOT = str(ROOT / "bot") + "/"
ADR = "ADR-20260831-01"  # the seed: --block-size 32, chunked prefill, 2048 batched tokens
ARGS = ["--model", "/models/llama-3-8b", "--max-num-batched-tokens", "8192"]
PASSING = {
    "ttft_ms": {"p99": 180.0}, "tpot_ms": {"p99": 21.5}, "goodput_ratio": 0.99,
    "kv_fragmentation": {"observed": 0.1}, "requests": {"total": 32, "failed": 0},
}  # fmt: skip
READS = ("bot/adr/shared.py", "find")  # one read of the store for one record
TO_THREAD = "asyncio/threads.py"
NAMES = {"to_thread"}  # functions outside bot/ the hook looks at
CHECKS = {  # what the walk checks more than once unless the code says why
    "signature": ("bot/app/routes/endpoints.py", "_BytesVerifier.generate_signature"),
    "body_shape": ("bot/surfaces/slack/shapes.py", "check"),
    "like_for_like": ("bot/remediation/run.py", "like_for_like"),
}


TRANSACTION = ("bot/kernel/store/db.py", "Database.transaction")
CARD = ("bot/remediation/card.py", "Card.view")
FROM = re.compile(r"\bFROM\s+\"?(\w+)")


class Walk:
    """The profile hook: what bot/ code ran, and who read the ADR store; and, as an engine
    event, each SQL statement that read a change's row."""

    def __init__(self) -> None:
        self.reads: Counter[str] = Counter()
        self.counting = False
        self.calls: Counter[tuple[str, str]] = Counter()
        self.adr_reads: Counter[str] = Counter()
        self._entry: dict[CodeType, int] = {}
        self._askers: list[str] = []  # who sent each ADR read off the loop, in order

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        code = frame.f_code
        if event != "call" or code.co_name not in NAMES and not code.co_filename.startswith(BOT):
            return
        if frame.f_lasti > self._first_resume(code):
            return  # a generator or coroutine resumed: not a new call
        if code.co_name == "to_thread" and code.co_filename.endswith(TO_THREAD):
            self._sent_off(frame)
        if not code.co_filename.startswith(BOT):
            return
        where = code.co_filename.removeprefix(str(ROOT) + "/")
        self.calls[(where, code.co_qualname)] += 1
        if (where, code.co_name) == READS:
            asker = _asker(frame)
            if asker is None and self._askers:
                asker = self._askers.pop(0)
            self.adr_reads[asker or "?"] += 1

    def _sent_off(self, frame: FrameType) -> None:
        """A read of the ADR store sent off the loop: remember who sent it (its thread's stack
        does not say)."""
        func = frame.f_locals.get("func")
        owner = getattr(getattr(func, "__self__", None), "__class__", None)
        if owner is not None and owner.__name__.endswith("AdrStore"):
            self._askers.append(_asker(frame) or "?")

    def _first_resume(self, code: CodeType) -> int:
        """Where a fresh call of ``code`` stands at its call event (3.11: its first RESUME)."""
        if code not in self._entry:
            offsets = [i.offset for i in dis.get_instructions(code) if i.opname == "RESUME"]
            self._entry[code] = offsets[0] if offsets else 0
        return self._entry[code]

    @contextlib.contextmanager
    def on(self, h: Harness) -> Iterator[None]:
        """Count what the block makes the bot do (its start, adr/ imported, is not counted)."""
        h.bot.remediation.card._adrs.sync()
        event.listen(h.bot.db.engine, "before_cursor_execute", self.statement)
        try:
            self.counting = True
            sys.setprofile(self)
            threading.setprofile(self)
            yield
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
            self.counting = False

    def statement(self, conn: object, cursor: object, statement: str, *args: object) -> None:
        """An engine's before_cursor_execute: count each SELECT by the table it reads."""
        if self.counting and statement.lstrip().upper().startswith("SELECT"):
            table = FROM.search(statement)
            self.reads[table[1] if table else "?"] += 1

    def summary(self) -> dict[str, Any]:
        return {
            "functions": len(self.calls),
            "modules": len({where for where, _ in self.calls}),
            "calls": sum(self.calls.values()),
            "adr_reads": sum(self.adr_reads.values()),
            "adr_read_by": dict(self.adr_reads),
            "checks": {name: sum(n for key, n in self.calls.items() if key == where)
                       for name, where in CHECKS.items()},
            "transactions": self.calls[TRANSACTION],
            "change_reads": self.reads["changes"],
            "row_reads": dict(self.reads.most_common()),
            "card_renders": self.calls[CARD],
        }  # fmt: skip


def _asker(frame: FrameType) -> str | None:
    """The first bot/ function outside bot/adr/ on the stack: who wanted the ADR."""
    caller = frame.f_back
    while caller is not None:
        name = caller.f_code.co_filename
        if name.startswith(BOT) and not name.startswith(BOT + "adr/"):
            return f"{name.removeprefix(BOT)}:{caller.f_code.co_qualname}"
        caller = caller.f_back
    return None  # on a worker thread (asyncio.to_thread): its stack does not say


async def passing(
    base_url: str, spec: CanarySpec, gates: AdrGates, *, shape: object = None,
    **judging: object,
) -> GateRun:
    """The gate: a recorded report that meets the seed's gates, judged by the real judge."""
    return judged(PASSING, gates_from(gates))


async def one_change(walk: Walk, tmp: Path) -> str:
    """/apply-adr, Approve, the run and the draft; the change's last state."""
    kube = FakeKube()
    kube.add_deployment("vllm", args=ARGS, replicas=2)
    actuators = KubeActuators(kube, FakeTime())
    spec = {"kind": "kubernetes", "namespace": "inference", "deployment": "vllm",
            "token_file": None, "ca_file": None}  # fmt: skip
    with FakeSlack() as slack:
        h = harness(
            tmp, slack=slack, bot_options={"actuator_for": actuators, "gate": passing},
            targets={"prod-a": {"vllm_url": "http://10.0.0.5:8000", "actuator": spec}},
        )  # fmt: skip
        with walk.on(h):
            await h.slash(f"{ADR} prod-a", command="/apply-adr")
            await slack.until("response_url")  # the answer: the card is posted and remembered
            await h.bot.tasks.drain()
            card = next(c for c in slack.of("chat.postMessage") if _buttons(c))
            await h.click(
                _buttons(card)["remediation_approve"], user="U2", action_id="remediation_approve"
            )
            await h.bot.tasks.drain()
        try:
            with h.bot.db.transaction() as s:
                (rem,) = s.scalars(select(Remediation)).all()
                drafts = len(s.scalars(select(AdrDraft)).all())
            return f"{rem.state}, {drafts} draft"
        finally:
            await h.close()
            await actuators.aclose()


async def one_alert(walk: Walk, tmp: Path) -> str:
    """An Alertmanager notification to its posted diagnosis: the incident opened, the runbook
    run on recorded /metrics pages, the findings and the matching ADR posted in the thread;
    the incident's state and how many Slack messages it has."""
    with FakeSlack() as slack:
        h = harness(tmp, slack=slack, matching_adr=True)
        with walk.on(h):
            response = await h.webhook(alert_body(alert()))
            await slack.until("chat.update")
            await h.bot.tasks.drain()
        try:
            return f"{response.json()['outcome']}, {len(slack.of('chat.postMessage'))} messages"
        finally:
            await h.close()


def _buttons(call: Any) -> dict[str, str]:
    return {
        element["action_id"]: element["value"]
        for block in call.args.get("blocks", [])
        if block["type"] == "actions"
        for element in block["elements"]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--list", action="store_true", help="also each function and its calls")
    args = parser.parse_args()
    walks = {"/apply-adr -> verdict -> draft": one_change, "alert -> diagnosis": one_alert}
    every = []
    for path, drive in walks.items():
        walk = Walk()
        with tempfile.TemporaryDirectory() as tmp:
            state = asyncio.run(drive(walk, Path(tmp)))
        found = {"path": path, "state": state, **walk.summary()}
        if args.list:
            found["each"] = {f"{w}:{name}": n for (w, name), n in sorted(walk.calls.items())}
        every.append(found)
    if args.json:
        print(json.dumps(every, indent=2))
        return
    for found in every:
        for key, value in found.items():
            print(f"{key:>13}: {value}")
        print()


if __name__ == "__main__":
    main()
