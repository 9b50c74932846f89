"""The demo scenario: normal, then a bad flag's incident, an alert, a diagnosis, an applied ADR.

Everything is real except Slack: the console transport prints what the bot would post. The
engine starts with `--max-num-batched-tokens 8192`. First the demo measures the engine's
prefill speed, then the chats run alone and the scheduler's snapshot job measures the engine's
normal four numbers into the store. Then streams of long prompts (sized from that speed) join
the chats: with 8192 tokens per scheduler step, whole long prefills share a step with the chats'
decode tokens, so every chat token waits for them (the incident is what the flag does, on any
machine). Every window and wait is sized from what was measured on this engine. An
Alertmanager-format alert goes to the bot's own webhook; the bot diagnoses against that normal
and matches the shipped CPU ADR, whose condition and gates are multiples of normal; the
on-call engineer requests it, a second person approves, and the engine restarts with the fix
behind the ADR's canary gates. The same load is measured again on the fixed engine, and the
post-incident ADR is drafted. Then the second act (``bot.app.demo.drift_act``): production starts
sending other traffic, and the bot notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import math
import shutil
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx
import yaml

from bot.adr import (
    GATE_METRICS,
    Adr,
    AdrGates,
    MatchResult,
    Relative,
    SharedAdrStore,
    file_id,
    load,
)
from bot.adr.match import match
from bot.adr.workload import WorkloadShape
from bot.app.demo.drift_act import (
    AGENT_STREAMS,
    SYSTEM_PROMPT,
    DriftShown,
    agent_load,
    console_line,
    record_workload,
    run_retune,
    run_second_act,
)
from bot.app.demo.screen import DemoResult, Numbers
from bot.app.scheduler.snapshots import WARM_REQUESTS, MetricsSampler, SnapshotJob
from bot.app.scheduler.workload_drift import LiveShape
from bot.app.server import Bot, create_bot
from bot.canary import CanaryRun, CancelMode, Outcome, Workload
from bot.diagnosis import NormalReader, match_readings, summary_numbers
from bot.engine import EngineManager
from bot.kernel import RuleloopError, Settings, Target
from bot.kernel.numbers import FOUR, Measured, show, show_reading
from bot.kernel.numbers import change as text_change
from bot.kernel.store import (
    AdrDraft,
    AuditEntry,
    Database,
    DiagnosisSummary,
    Incident,
    Remediation,
    buttons,
)
from bot.remediation import SUBJECT

HERE = Path(__file__).parent
ADR_ID = "ADR-20261129-02"
ADR_FILE = f"{ADR_ID}-cpu-demo-scheduler-step.md"
BAD_FLAGS = ["--enforce-eager", "--max-num-batched-tokens", "8192", "--max-num-seqs", "32"]
TARGET = "local"
ONCALL, APPROVER = "U0ONCALL", "U0LEAD"
TOKEN = "demo-alertmanager-token"

CHAT_STREAMS = 6
# 16-token answers: every answer token of the incident waits for a bad step, so the chats'
# length sets every window the incident needs (32 doubled them for no more evidence: a chat's
# TPOT is already the mean of its 15 gaps).
CHAT_OUTPUT = 16
# Long prompts always waiting, all four fit one bad step whole (4 x 2048 <= 8192). Eight
# stalled the chats 4.5x as long (462 vs 102 ms here) for a match that needs 3x normal.
LONG_STREAMS = 4
BAD_STEP, FIX_STEP = 8192, 512  # --max-num-batched-tokens before and after the fix
# A bad step (the four long prompts at once) takes about STALL_S of this engine's prefill, so
# a slow machine's chats wait no longer than the match needs: 960-1,024-token prompts at a
# tenth of a core (1,630-1,670 tokens/s: the chats' TPOT p99 0.94 s against a normal 0.1 s;
# 768 gave 0.72 s against 0.14 s, too little margin over 3x); at least 512 (one fixed step:
# the fix spreads a bad step's work over four steps or more); at most 2,048 (four fill a bad
# step: 0.5 s on an AVX-512 core). Fixed at 2,048, an AVX2 machine's chats waited 5 s a token
# and its long prompts' TTFT p99 was 19 s.
STALL_S = 2.5
MAX_LONG, MIN_LONG = BAD_STEP // LONG_STREAMS, FIX_STEP
PROBE_SHORT, PROBE_LONG = 64, MAX_LONG  # the prefill-speed probe: prompt lengths, sent alone
# The gate's background: four chunks of the fixed step. The before/after ratio is the tokens
# a bad step takes over the 512 a fixed one does, whatever the speed (measured at 0.1 core:
# 1024-token prompts 1.9x, under the 2x the gate asks; 2048-token ones 4-8x).
CANARY_LONG = 4 * FIX_STEP
CANARY_STREAMS = 4
# The gate, TPOT p99 '0.5x before', is judged two-sample: a one-sided Mann-Whitney U test of the
# canary's per-request TPOTs against half of the before-run's, at 99 %. Four requests a side
# cannot reach 99 % even when every one is faster (p 0.015; five is the fewest, p 0.006), so
# each run takes two measured rounds of its four streams: eight a side, p 0.0005 when the fix
# separates them, room for a request or two that does not. Each request's TPOT is already the
# mean of its 7 token gaps, stalled steps and decode-only ones alike. 8 tokens, not 16: each gap
# of the before-run waits about a bad step (2-3 s at 0.1 core; the before-run took 89 s there
# with 16 tokens and one round).
CANARY_REQUESTS, CANARY_OUTPUT = 8, 8
RETUNE_TRIALS = 1  # the re-tune's grid, smallest step first: the fix's at a quarter
SNAPSHOTS = 3  # "normal" is their median, as the scheduler's `normal_of_last`
NORMAL_CHATS = 12  # chats finished per normal window (engine TPOT p99 over 12: about their max)
MIN_WINDOW_S = 3.0  # the probe scrapes each second: a window holds at least three scrapes
# Each chat stream finishes a chat at least once per slowest chat (closed loop): a window of
# 1.5 of them holds one finished chat per stream or more, with room for a slower one.
WINDOW_CHATS = 1.5
WINDOW_S = 8.0  # the runbook's window until the incident's is measured
LOAD_S = 900.0  # the loads run until stopped; this only bounds a forgotten one
DIAGNOSIS_WINDOWS = 4  # the diagnosis takes at most this many windows (two probes sample one)
SLACK_S = 60.0  # headroom past what was measured, for the bot's own work
MIN_RESTART_S = 60.0  # the restart's bound: twice the measured first start, at least this


class DemoFailed(RuleloopError):
    """The demo could not close the loop on this machine; the message says where and why."""

    exit_code = 1


def workspace(root: Path, repo_adr: Path | None) -> Path:
    """A fresh directory with the ADRs (the repo's, plus the CPU one) and the demo runbook."""
    ws = root / f"demo-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S%f}"
    (ws / "adr").mkdir(parents=True)
    (ws / "runbooks").mkdir()
    if repo_adr is not None and repo_adr.is_dir():
        for path in repo_adr.glob("ADR-*.md"):
            shutil.copy(path, ws / "adr" / path.name)
    shutil.copy(HERE / ADR_FILE, ws / "adr")
    write_runbook(ws, window_s=WINDOW_S)
    return ws


def write_runbook(ws: Path, *, window_s: float) -> None:
    """The demo runbook with its sampling window set (long enough for chats to finish in it)."""
    runbook = yaml.safe_load((HERE / "runbook.yaml").read_text(encoding="utf-8"))
    for probe in runbook["probes"]:
        if "window_s" in probe.get("params", {}):
            probe["params"]["window_s"] = window_s
    (ws / "runbooks" / "demo.yaml").write_text(
        yaml.safe_dump(runbook, sort_keys=False), encoding="utf-8"
    )


@dataclass(frozen=True)
class Pace:
    """What this engine was measured to do, and the sizes and bounds that follow from it."""

    prefill_tok_s: float  # prompt tokens per second, the engine alone
    start_s: float  # the first engine start, seconds

    @property
    def long_prompt(self) -> int:
        """The incident's long prompt (tokens), a multiple of 64: four of them (one bad step)
        take about STALL_S to prefill here."""
        tokens = int(self.prefill_tok_s * STALL_S / LONG_STREAMS) // 64 * 64
        return max(MIN_LONG, min(MAX_LONG, tokens))

    def request_s(self, tokens: int) -> float:
        """A bound on a request of ``tokens`` output tokens: each waits at most one full bad
        step (8192 prompt tokens), twice that, plus 30 s for HTTP; a broken engine past it."""
        return 2 * tokens * BAD_STEP / self.prefill_tok_s + 30.0

    @property
    def restart_s(self) -> float:
        """A bound on the engine's restart with the fix: twice its first start."""
        return max(MIN_RESTART_S, 2 * self.start_s)

    @property
    def canary_s(self) -> float:
        """A bound on one gate canary: its warm-up round and its measured rounds."""
        rounds = 1 + math.ceil(CANARY_REQUESTS / CANARY_STREAMS)
        return rounds * self.request_s(CANARY_OUTPUT)


def settings(
    ws: Path,
    *,
    base_url: str,
    state_dir: Path,
    cpu_limit: float | None = None,
    pace: Pace | None = None,
) -> Settings:
    """Embedded defaults: one local target, an on-call engineer and an approver; the canary and
    the restart bounded by ``pace`` (a fast machine's when not measured)."""
    pace = pace or Pace(prefill_tok_s=16384.0, start_s=300.0)
    return Settings.model_validate(
        {
            "slack": {"channel": "#inference-incidents"},
            "access": {"diagnose": ["*"], "apply": [ONCALL], "approve": [APPROVER],
                       "review": [APPROVER]},
            "targets": {
                TARGET: {
                    "vllm_url": base_url,
                    # the step budget the incident runs with: the diagnosis bounds its step
                    # readings by it (a chunked prompt's credit is not a step)
                    "step_budget": BAD_STEP,
                    "actuator": {"kind": "local", "flags": BAD_FLAGS,
                                 "state_dir": str(state_dir),
                                 "start_timeout_s": pace.restart_s, "cpu_limit": cpu_limit},
                    # the gate: chats beside streams of long prompts (as the incident)
                    "canary": {"concurrency": CANARY_STREAMS, "num_requests": CANARY_REQUESTS,
                               "prompt_length": 128, "output_length": CANARY_OUTPUT,
                               "background_concurrency": CANARY_STREAMS,
                               "background_prompt_length": CANARY_LONG,
                               "background_output_length": 1, "timeout_s": pace.canary_s,
                               # the drift job's before-run: the rule's replaced flags on the
                               # live traffic, so '0.5x before' is judged like for like
                               "baseline": True, "drift_before_run": True},
                    "two_person": True,
                    # the re-tune's budget: each trial restarts the engine twice (its flags,
                    # then the fix back), so the demo tries the most promising point only
                    "drift": {"retune_trials": RETUNE_TRIALS},
                }
            },
            "scheduler": {"snapshot_window_s": WINDOW_S, "normal_of_last": SNAPSHOTS},
            "alertmanager": {"token": TOKEN},
            "paths": {"runbooks": str(ws / "runbooks"), "adr": str(ws / "adr"), "state": str(ws)},
        }
    )  # fmt: skip


def chat_load(base_url: str) -> Workload:
    """Chats: short prompts, 16-token answers; a fifth of the clients give up after 8 tokens
    (a count, not a time: it holds on a machine of any speed)."""
    return Workload(
        endpoint=f"{base_url}/v1/completions", concurrency=CHAT_STREAMS, num_requests=None,
        duration_s=LOAD_S, prompt_length=128, output_length=CHAT_OUTPUT, cancel_share=0.2,
        cancel_after_tokens=8, cancel_mode=CancelMode.ABANDON, seed=1,
    )  # fmt: skip


def long_load(base_url: str, prompt: int) -> Workload:
    """Long prompts that want one token back (a classifier, an agent's tool choice)."""
    return Workload(
        endpoint=f"{base_url}/v1/completions", concurrency=LONG_STREAMS, num_requests=None,
        duration_s=LOAD_S, prompt_length=prompt, output_length=1, seed=2,
    )  # fmt: skip


def incident_load(base_url: str, prompt: int) -> list[Workload]:
    """The chats beside the long prompts (``prompt`` tokens each)."""
    return [chat_load(base_url), long_load(base_url, prompt)]


async def prefill_speed(base_url: str) -> float:
    """Prompt tokens per second of the engine alone: a long prompt's TTFT less a short one's
    (the request's own cost), the faster of two each."""
    ttft = {}
    for length in (PROBE_SHORT, PROBE_LONG):
        run = CanaryRun(
            Workload(
                endpoint=f"{base_url}/v1/completions", concurrency=1, num_requests=2,
                prompt_length=length, output_length=1, seed=4,
            ),
            metrics_url=None,
        )  # fmt: skip
        await run.run()
        ttft[length] = min(r.ttft_s for r in run.records if r.ttft_s is not None)
    # a gap lost in the noise reads as the long prompt's whole TTFT (slower: longer waits)
    gap = ttft[PROBE_LONG] - ttft[PROBE_SHORT]
    if gap < ttft[PROBE_LONG] / 4:
        return PROBE_LONG / ttft[PROBE_LONG]
    return (PROBE_LONG - PROBE_SHORT) / gap


def alert(base_url: str) -> bytes:
    """An Alertmanager v4 notification, as the shipped TTFT rule would send it."""
    host = base_url.split("://", 1)[1]
    now = dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")
    labels = {"alertname": "VLLMTimeToFirstTokenP99High", "severity": "critical",
              "instance": host, "ruleloop_target": TARGET}  # fmt: skip
    body = {
        "version": "4", "groupKey": '{}:{alertname="VLLMTimeToFirstTokenP99High"}',
        "truncatedAlerts": 0, "status": "firing", "receiver": "ruleloop",
        "groupLabels": {"alertname": labels["alertname"]}, "commonLabels": labels,
        "commonAnnotations": {}, "externalURL": "http://alertmanager:9093",
        "alerts": [{
            "status": "firing", "labels": labels,
            "annotations": {"summary": f"chat latency on {host} far above its normal (demo)"},
            "startsAt": now, "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph", "fingerprint": "d3m0f1ngerpr1nt0",
        }],
    }  # fmt: skip
    return json.dumps(body).encode()


def check_incident(adr: Adr, summary: DiagnosisSummary) -> MatchResult:
    """The diagnosis must match the demo ADR; else DemoFailed with each condition explained.

    ``summary`` is the incident's stored diagnosis (``Diagnosis.summary()``): its readings and
    the normal it was diagnosed against are read the way the bot read them.
    """
    readings = summary.readings
    if not readings:
        raise DemoFailed(
            "the bot's diagnosis produced no numbers (it failed; its error is logged above), "
            "so the demo cannot tell whether the incident happened"
        )
    report = match_readings(summary_numbers(summary, "readings"))
    result = match(adr, report, summary_numbers(summary, "normal"))
    if adr.id in summary.matches and result.matches:
        return result
    why = "; ".join(c.explain() for c in result.conditions) or "the ADR has no conditions"
    raise DemoFailed(
        f"the incident was not produced on this machine, so there is nothing for {adr.id} to "
        f"fix: {why}. The long prompts should have stalled the chats' decode steps; check that "
        "nothing else was using the engine's CPU while the demo ran, then run it again."
    )


def gate_lines(
    gates: AdrGates,
    limits: Mapping[str, float],
    numbers: Numbers,
    before: Numbers | None = None,
    missed: Collection[str] = (),
) -> list[str]:
    """Each gate as written, the limit it came to, the canary's number and the canary's own
    judge's word on it (``missed``: the names of the gates the remediation's canary missed; the
    judge decided on per-request statistics, not on these points); with the before-run of the
    same canary, the change ('before 1,710 ms, -87 %')."""
    labels = {key: label for key, label, *_ in FOUR}
    lines = []
    for gate, metric in GATE_METRICS.items():
        written, limit, value = getattr(gates, gate), limits.get(gate), numbers.get(metric)
        if written is None:
            continue
        at_least = gate.startswith("min_")
        shown = show(metric, limit)
        if isinstance(written, Relative):
            shown = f"{written} (= {shown})"
        was = (before or {}).get(metric)
        change = ""
        if was is not None and value is not None and was != 0:
            change = f" (before → after: {text_change(metric, was, value)})"
        lines.append(
            f"{labels[metric]} {show(metric, value)} {'≥' if at_least else '≤'} {shown}: "
            + ("MISSED" if gate in missed else "met")
            + change
        )
    return lines


@dataclass
class _Load:
    """Workloads running in the background until stopped."""

    runs: list[CanaryRun]
    tasks: list[asyncio.Task[Any]]
    wait_s: float  # requests that do not finish in this long mean a broken engine

    @classmethod
    def start(cls, workloads: list[Workload], *, wait_s: float) -> _Load:
        runs = [CanaryRun(w, metrics_url=None) for w in workloads]
        return cls(runs, [asyncio.create_task(run.run()) for run in runs], wait_s)

    async def steady(self) -> float:
        """Wait for the incident's steady state: every long-prompt stream served once, then
        every chat stream's worth of chats sent after that finished; the slowest of those (s).

        Chats finishing before that may have started ahead of the long prompts and met only
        part of the stall; these met it for their whole life, so the window can be sized on them.
        """
        first = await self.started(1)
        await self.finished(1, since=first, count=LONG_STREAMS)
        return await self.finished(0, since=time.perf_counter(), count=CHAT_STREAMS)

    async def started(self, index: int) -> float:
        """When the first request of workload ``index`` was sent (waits for it)."""
        run = self.runs[index]
        while not run.records:
            self._check()
            await asyncio.sleep(0.05)
        return run.records[0].sent_at

    async def finished(self, index: int, *, since: float, count: int) -> float:
        """Wait until ``count`` requests of workload ``index`` sent after ``since`` finished
        normally; how long the slowest of them took (s)."""
        run = self.runs[index]
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            self._check()
            done = [
                r.e2e_s
                for r in list(run.records)
                if r.sent_at >= since and r.outcome is Outcome.OK and r.e2e_s is not None
            ]
            if len(done) >= count:
                return max(done)
            await asyncio.sleep(0.1)
        raise DemoFailed(
            f"fewer than {count} requests finished in {self.wait_s:.0f} s: the engine at "
            f"{run.workload.base_url} is not answering"
        )

    def _check(self) -> None:
        for task in self.tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise DemoFailed(f"the load generator stopped: {task.exception()}")

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class Demo:
    """Runs the scenario against an engine already started on ``base_url``."""

    def __init__(
        self,
        *,
        ws: Path,
        base_url: str,
        manager: EngineManager,
        say: Callable[[str], None],
        transcript: TextIO,
        start_s: float,
    ) -> None:
        self.ws = ws
        self.base_url = base_url
        self._say = say
        self._manager = manager
        self._start_s = start_s  # the first engine start (s)
        self._transcript = transcript
        self._adr = load(ws / "adr" / ADR_FILE)
        self._pace = Pace(prefill_tok_s=16384.0, start_s=start_s)  # until measured
        self._use_pace(self._pace)

    def _use_pace(self, pace: Pace) -> None:
        """Settings (the canary, the restart's bound) for what was measured."""
        self._pace = pace
        self._settings = settings(
            self.ws, base_url=self.base_url, state_dir=self._manager.state_dir,
            cpu_limit=self._manager.cpu_limit, pace=pace,
        )  # fmt: skip
        self._target: Target = self._settings.targets[TARGET]

    def _load(self, workloads: list[Workload]) -> _Load:
        return _Load.start(workloads, wait_s=self._pace.request_s(CHAT_OUTPUT))

    async def run(self) -> DemoResult:
        """The whole story; DemoFailed when a step did not happen on this machine."""
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as http:
            normal = await self._normal(http)
            load = self._load(incident_load(self.base_url, self._pace.long_prompt))
            try:
                window = await self._steady(load)
                bot = create_bot(self._settings, state_dir=self.ws, console=self._transcript)
            except BaseException:
                await load.stop()
                raise
            try:
                try:
                    incident_id = await self._alert(bot, window)
                finally:
                    await load.stop()
                summary = await asyncio.to_thread(self._summary, bot, incident_id)
                matched = check_incident(self._adr, summary)
                rem = await self._remediate(bot, incident_id)
                after, kept_under = Measured(), None
                if rem.state == "promoted":
                    after, kept_under = await self._after(http)
                draft = await asyncio.to_thread(self._draft, bot, incident_id)
                drift = None if kept_under is None else await self._second_act(bot, kept_under)
            finally:
                await bot.tasks.drain(timeout_s=900)
                await bot.http.aclose()
                bot.db.dispose()
        draft = self._story_ended(rem, draft)
        assert self._adr.gates is not None  # an accepted ADR has gates (the validator insists)
        return DemoResult(
            adr_id=self._adr.id,
            normal=normal,
            incident=summary_numbers(summary),
            after=after,
            state=rem.state,
            matched=[c.explain() for c in matched.conditions],
            gates=gate_lines(
                self._adr.gates,
                rem.result.get("gates") or {},
                rem.result.get("numbers") or {},
                rem.result.get("before_numbers") or {},
                rem.result.get("missed") or [],
            ),
            how_sure=rem.result.get("how_sure") or [],
            watched=[*(rem.result.get("watched") or []), *(rem.result.get("held") or [])],
            chart=next(iter(sorted((self.ws / "charts").glob("*.png"))), None),
            draft=draft,
            drift=drift,
            notes=(
                f"normal: median of {SNAPSHOTS} snapshots, {CHAT_STREAMS} chat streams alone; "
                "incident: the diagnosis;",
                "after the fix: the incident's load again, read the same way "
                f"(vllm_metrics, {WINDOW_CHATS:g}x its slowest chat)",
            ),
        )

    def _story_ended(self, rem: Remediation, draft: Path | None) -> Path:
        """The post-incident ADR the story ends with; DemoFailed when the remediation failed
        or drafted none (the last screen would show a story that did not happen)."""
        if rem.state == "failed":
            raise DemoFailed(
                f"the remediation failed: {rem.result.get('reason') or 'see the card above'}; "
                f"the engine on {self.base_url} may need a manual restart"
            )
        if draft is None:
            raise DemoFailed(
                f"the remediation ended {rem.state} but no post-incident ADR was drafted"
            )
        return draft

    # --- 3/10: normal -------------------------------------------------------------------------
    async def _normal(self, http: httpx.AsyncClient) -> Measured:
        self._say(
            f"3/10 normal: the engine's prefill speed, then {CHAT_STREAMS} chat streams alone; "
            f"the scheduler's snapshot job takes {SNAPSHOTS} snapshots of the four numbers "
            "into the store ..."
        )
        speed = await prefill_speed(self.base_url)
        self._use_pace(Pace(prefill_tok_s=speed, start_s=self._start_s))
        self._say(
            f"    prefill: {speed:,.0f} tokens/s alone, so a long prompt is "
            f"{self._pace.long_prompt:,} tokens (four take about {STALL_S:g} s, "
            f"{MIN_LONG:,}-{MAX_LONG:,})"
        )
        db = Database(self._settings.database_url(fallback_dir=self.ws))
        db.create_schema()
        load = self._load([chat_load(self.base_url)])
        try:
            since = time.perf_counter()
            # the snapshot job skips an engine that finished fewer than WARM_REQUESTS
            await load.finished(0, since=since, count=WARM_REQUESTS)
            rate = WARM_REQUESTS / (time.perf_counter() - since)  # chats/s, warm-up included
            window = max(MIN_WINDOW_S, float(math.ceil(NORMAL_CHATS / rate)))
            self._say(f"    chats alone: {rate:.1f}/s, so each snapshot reads {window:g} s")
            await self._snapshots(http, db, window)
        finally:
            await load.stop()
        try:
            normal = await NormalReader(db=db, last=SNAPSHOTS).read(TARGET)
        finally:
            db.dispose()
        self._say("    normal: " + _four(normal))
        return normal

    async def _snapshots(self, http: httpx.AsyncClient, db: Database, window: float) -> None:
        """SNAPSHOTS snapshots of ``window`` seconds into the store, as the scheduler's job."""
        sampler = MetricsSampler(http=http, window_s=window)
        job = SnapshotJob(name=TARGET, target=self._target, sample=sampler, source=sampler.source)
        taken = 0
        for _ in range(SNAPSHOTS * 10):  # a cold engine's windows are skipped, not kept
            outcome = await job(dt.datetime.now(dt.UTC))
            if outcome.write is None:
                self._say(f"    {outcome.detail.get('skipped', 'no snapshot')}")
                continue
            with db.transaction() as session:
                outcome.write(session)
            taken += 1
            if taken == SNAPSHOTS:
                return
        raise DemoFailed(f"the engine never warmed up: {taken} of {SNAPSHOTS} snapshots")

    # --- 4/10: the incident, the alert, the diagnosis ---------------------------------------------
    async def _steady(self, load: _Load) -> float:
        """Wait for the incident's steady state; the window (s) the diagnosis needs for chats
        to finish inside it: twice the slowest chat sent in the steady state."""
        self._say(
            f"4/10 incident: {LONG_STREAMS} streams of {self._pace.long_prompt:,}-token prompts "
            "join the chats; "
            "with --max-num-batched-tokens 8192 whole prompts share a scheduler step with the "
            "chats' next tokens ..."
        )
        slowest = await load.steady()
        window = _window(slowest)
        self._say(f"    the slowest chat took {slowest:.1f} s, so the diagnosis reads {window:g} s")
        write_runbook(self.ws, window_s=window)
        return window

    async def _alert(self, bot: Bot, window: float) -> int:
        self._say("5/10 Alertmanager fires VLLMTimeToFirstTokenP99High at the bot's webhook")
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=bot.app), base_url="http://ruleloop"
        ) as client:
            response = await client.post(
                "/alertmanager", content=alert(self.base_url),
                headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
            )  # fmt: skip
        if response.status_code != 202:
            raise DemoFailed(f"the bot refused the alert: {response.text}")
        incident_id = int(response.json()["incident"])
        self._say(f"    incident #{incident_id} opened; diagnosing over {window:g} s ...")
        # the runbook's probes each sample one window; the rest is scrapes and the chart
        await bot.tasks.drain(timeout_s=DIAGNOSIS_WINDOWS * window + SLACK_S)
        return incident_id

    def _summary(self, bot: Bot, incident_id: int) -> DiagnosisSummary:
        with bot.db.transaction() as s:
            incident = s.get(Incident, incident_id)
            assert incident is not None
            return incident.summary

    # --- 6/10 and 7/10: request, approval, apply, canary ---------------------------------------
    async def _remediate(self, bot: Bot, incident_id: int) -> Remediation:
        self._say(f"6/10 {ONCALL} asks for {ADR_ID} (as /apply-adr would); {APPROVER} approves")
        ack = await bot.remediation.request(user_id=ONCALL, adr_id=ADR_ID, incident_id=incident_id)
        self._say(f"    bot: {ack}")
        with bot.db.transaction() as s:
            rem = s.query(Remediation).filter_by(incident_id=incident_id).one()
        tokens = await bot.remediation.records.tokens(buttons.subject(SUBJECT, rem.id))
        await bot.remediation.click(user_id=APPROVER, token=tokens["approve"])
        self._say(
            "7/10 the same canary on the current flags first, then the engine restarts with "
            "--max-num-batched-tokens 512 and the canary (4 chat streams beside 4 long-prompt "
            "streams) checks the ADR's gates ..."
        )
        # the before-run, a restart and the canary, each within its measured bound
        timeout = 2 * self._pace.canary_s + self._pace.restart_s + SLACK_S
        await bot.tasks.drain(timeout_s=timeout)
        with bot.db.transaction() as s:
            done = s.get(Remediation, rem.id)
            assert done is not None
            stamps: dict[str, dt.datetime] = {}
            for entry in (
                s.query(AuditEntry).filter_by(incident_id=incident_id).order_by(AuditEntry.id)
            ):
                stamps.setdefault(entry.action, entry.at)
        self._say(f"    outcome: {done.state} ({phase_times(stamps)})")
        return done

    async def _after(self, http: httpx.AsyncClient) -> tuple[Measured, WorkloadShape]:
        """The four numbers of the incident's load on the fixed engine, and its shape over the
        same window (the traffic the rule was kept under)."""
        self._say("    the incident's load again, on the fixed engine, read the same way ...")
        load = self._load(incident_load(self.base_url, self._pace.long_prompt))
        try:
            slowest = await load.steady()
            window = _window(slowest)
            sampler = MetricsSampler(http=http, window_s=window)
            return await asyncio.gather(
                sampler(TARGET, self._target),
                LiveShape(http=http, window_s=window)(TARGET, self._target),  # as the job reads it
            )
        finally:
            await load.stop()

    # --- 9/10: the next workload ----------------------------------------------------------------
    async def _second_act(self, bot: Bot, kept_under: WorkloadShape) -> DriftShown:
        line = record_workload(self.ws / "adr" / ADR_FILE, kept_under)
        self._say(f"    {ADR_ID} records the traffic it was kept under: {line}")
        self._say(
            f"9/10 a new agent workflow starts beside the chats: {AGENT_STREAMS} streams whose "
            f"prompts all open with the same {SYSTEM_PROMPT:,}-token system prompt. The "
            "scheduler's workload job compares the live traffic with the rule's ..."
        )
        load = self._load([chat_load(self.base_url), agent_load(self.base_url, duration_s=LOAD_S)])
        try:
            first = await load.started(1)
            pace = await load.finished(1, since=first, count=AGENT_STREAMS)
            shown = await run_second_act(
                bot, settings=self._settings, name=TARGET, adr_dir=self.ws / "adr",
                adr_id=ADR_ID, pace_s=pace, stop_load=load.stop,
            )  # fmt: skip
        finally:
            await load.stop()
        if shown.before:
            self._say(f"    before on the live traffic: {shown.before}")
        self._say(f"    {'; '.join(shown.verdict)}")
        if shown.next_step:
            self._say(f"    next step offered in the drift thread: {shown.next_step}")
        if shown.incident is None or not shown.next_step:
            return shown
        self._say(
            f"10/10 {APPROVER} presses [Re-tune on the live traffic]: the search restarts the "
            f"engine with each trial's flags ({RETUNE_TRIALS} trial here: the fix's step at a "
            "quarter), replays the live shape, judges it as the rule was judged, and restores "
            "the fix ..."
        )
        started = time.perf_counter()
        shown = await run_retune(bot, shown, approver=APPROVER)
        self._say(f"    {console_line(shown.retune)} ({time.perf_counter() - started:.0f} s)")
        return shown

    # --- 8/10: the draft ----------------------------------------------------------------------
    def _draft(self, bot: Bot, incident_id: int) -> Path | None:
        with bot.db.transaction() as s:
            draft = s.query(AdrDraft).filter_by(incident_id=incident_id).one_or_none()
            adr_id = None if draft is None else draft.adr_id
        if adr_id is None:
            return None
        # the draft lives in the store; written out as `ruleloop adr export` would
        adrs = self.ws / "adr"
        exported = SharedAdrStore(root=adrs, db=bot.db, sync=False).export(adrs)
        path = next(p for p in [*exported.written, *exported.unchanged] if file_id(p) == adr_id)
        self._say(f"8/10 post-incident ADR drafted for review (exported from the store): {path}")
        return path


# 7/10's phases, each from the audit entry that starts it to the one that starts the next
PHASES = (
    ("before-run", "remediation.baseline_started", "remediation.applying"),
    ("restart", "remediation.applying", "remediation.canary_started"),
    ("canary", "remediation.canary_started", "remediation.canary_passed"),
)


def phase_times(stamps: Mapping[str, dt.datetime]) -> str:
    """'before-run 1:12, restart 0:48, canary 0:20' from the remediation's audit entries (the
    first of each action); a phase that did not happen is left out."""
    shown = []
    for name, start, end in PHASES:
        if start in stamps and end in stamps:
            seconds = (stamps[end] - stamps[start]).total_seconds()
            minutes, rest = divmod(round(seconds), 60)
            shown.append(f"{name} {minutes}:{rest:02d}")
    return ", ".join(shown) or "no phase timed"


def _window(slowest: float) -> float:
    """A window (s) for the engine's TPOT of the chats, from the slowest one measured."""
    return max(MIN_WINDOW_S, float(math.ceil(WINDOW_CHATS * slowest)))


def _four(sample: Measured) -> str:
    return ", ".join(f"{label} {show_reading(key, sample.reading(key))}" for key, label, *_ in FOUR)
