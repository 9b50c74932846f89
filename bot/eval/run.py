"""Runs a catalogue of scenarios on real local engines and grades each diagnosis.

Per scenario: the engine its flags name (started once per group of scenarios that share flags,
measured once: a chat alone, the longest whole-step prompt alone where a scenario needs it), the
fault (busy processes beside it), the load (its streams, sized from what was measured), and
while every stream holds its first token, the production diagnosis of the scenario's alert: the
runbooks given (their sampling window sized from this engine's speed), the real probes on the
engine's /metrics, the ADRs given. The verdicts are graded against the scenario's truth
(bot/eval/grades.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx

from bot.adr import AdrStore
from bot.adr.workload import WorkloadShape, context_line
from bot.adr.workload.diff import diff
from bot.canary import Judged
from bot.change import flags_text, with_flags
from bot.diagnosis import Diagnoser, Diagnosis, DriftCheck, RulesInForce, judge_causes
from bot.diagnosis.probes import ProbeContext, TargetRef
from bot.diagnosis.runbooks import LoadedRunbook, RunbookRunner, RunbookSet, default_registry
from bot.engine import EngineInfo, EngineManager, free_port
from bot.eval.fix import FixOutcome, judge_fix
from bot.eval.fleet import delayed, gateway, router
from bot.eval.grades import Graded, grade
from bot.eval.load import Client, LoadFailed, Measured, Stream, measure
from bot.eval.scenario import Scenario, StreamSpec
from bot.kernel import Target, UsageError

ENGINE_FLAGS = ("--enforce-eager",)  # the tiny model's throughput alike, ready in a third the time
DEFAULT_STEP_BUDGET = 2048  # vLLM V1's --max-num-batched-tokens on CPU when none is given
DEFAULT_SEQS = 256  # vLLM's --max-num-seqs when none is given
# a delay in front of the engine: at least this, so the gateway's share stands out of the noise
# (the hypothesis asks it to add more than 100 ms and more than half of the gateway's TTFT p99)
MIN_DELAY_S = 0.25
Echo = Callable[[str], None]


@dataclass(frozen=True)
class Ran:
    """One scenario's run: its grades, and the diagnosis's readings (re-judged by ``regrade``)."""

    graded: Graded
    diagnosis: Diagnosis
    runbook: LoadedRunbook


def streams_of(scenario: Scenario, m: Measured, specs: list[StreamSpec] | None = None
               ) -> list[Stream]:  # fmt: skip
    """The scenario's clients (or ``specs``), their sizes resolved against what the engine was
    measured to do."""
    seqs = scenario.flag("max-num-seqs", DEFAULT_SEQS)
    counted = [(spec, spec.count or (spec.per_seq or 1) * seqs)
               for spec in (specs or scenario.streams)]  # fmt: skip
    clients = sum(n for _, n in counted)
    out = []
    for spec, n in counted:
        prompt = m.step_prompt if spec.prompt == "step" else int(spec.prompt)
        output = _output(spec, m, prompt, clients)
        out += [Stream(prompt, output, spec.cancel_after, spec.prefix)] * n
    return out


def _output(spec: StreamSpec, m: Measured, prompt: int, clients: int) -> int:
    if spec.output != "kv_share":
        return int(spec.output)
    answer = 2 * m.kv_tokens // clients - prompt  # together: twice what the KV cache holds
    if not 0 < answer <= m.max_model_len - prompt:
        raise UsageError(
            f"kv_share: no answer fits ({clients} clients, {prompt}-token prompts, a KV cache of "
            f"{m.kv_tokens} tokens, max_model_len {m.max_model_len}): use fewer clients or a "
            "smaller --num-gpu-blocks-override"
        )
    return answer


def window_of(scenario: Scenario, m: Measured, streams: list[Stream]) -> float:
    """The sampling window: the longest of the scenario's multiples of measured times."""
    w = scenario.window
    seconds = [w.chats * m.chat_s]
    if w.step_prompts and m.step_prompt_s is not None:
        seconds.append(w.step_prompts * m.step_prompt_s)
    if w.kv_rounds:
        longest = max(s.output for s in streams)
        seconds.append(w.kv_rounds * len(streams) * longest * m.step_s)
    return max(seconds)


def sized(runbooks: RunbookSet, window_s: float) -> RunbookSet:
    """The runbooks with every sampling probe's window ``window_s`` (a tenth between scrapes)."""

    def one(loaded: LoadedRunbook) -> LoadedRunbook:
        params = tuple(
            p.model_copy(update={"window_s": window_s, "interval_s": window_s / 10})
            if {"window_s", "interval_s"} <= set(type(p).model_fields) else p
            for p in loaded.params
        )  # fmt: skip
        return dataclasses.replace(loaded, params=params)

    return RunbookSet(runbooks=tuple(one(rb) for rb in runbooks.runbooks))


@contextlib.contextmanager
def fault(scenario: Scenario) -> Iterator[None]:
    """The scenario's fault for as long as the block runs: ``cpu_hogs`` busy processes."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(scenario.fault.cpu_hogs)
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def regrade(ran: Ran, scenario: Scenario, runbooks: RunbookSet) -> Graded:
    """The same readings judged by other runbooks (a changed threshold), graded again."""
    other = next((rb for rb in runbooks.runbooks if rb.name == ran.runbook.name), None)
    if other is None:
        raise UsageError(f"no runbook named {ran.runbook.name!r} to re-judge with")
    judged = judge_causes(other.runbook, ran.diagnosis.readings)
    g = ran.graded
    return grade(scenario, {v.cause: v.verdict for v in judged}, offered=g.adr_offered,
                 extra_s=g.extra_s, window_s=g.window_s, sent=g.sent)  # fmt: skip


@dataclass(frozen=True)
class Serving:
    """What serves a scenario: its engines, and where its load goes (the one engine, or the
    fleet's router)."""

    url: str
    engines: list[EngineInfo]


class Catalogue:
    """Runs scenarios one after another, one engine or fleet at a time (the box is shared)."""

    def __init__(self, *, runbooks: RunbookSet, adrs: AdrStore, state_dir: Path, echo: Echo):
        self.runbooks, self.adrs, self.echo, self.state_dir = runbooks, adrs, echo, state_dir
        self.serving: Serving | None = None
        self.key: tuple[tuple[str, ...], int, tuple[str, ...]] | None = None
        self.measured: Measured | None = None
        self._up = contextlib.ExitStack()

    def _serve(self, scenario: Scenario) -> Serving:
        return self._serve_key(scenario.serving())

    def _serve_key(self, key: tuple[tuple[str, ...], int, tuple[str, ...]]) -> Serving:
        if self.serving is not None and self.key == key:
            return self.serving
        self.stop()
        flags, replicas, sick = key
        every = [[*ENGINE_FLAGS, *flags, *(sick if i == 0 else ())] for i in range(replicas)]
        what = " ".join(flags) or "(vLLM defaults)"
        self.echo(f"  starting {replicas} engines behind nginx: {what}" + (
            f"; the first also {' '.join(sick)}" if sick else "") + " …"
            if replicas > 1 else f"  starting an engine: {what} …")  # fmt: skip
        started = time.monotonic()
        engines = [self._start(i, f) for i, f in enumerate(every)]
        url = self._up.enter_context(router([e.port for e in engines])) if replicas > 1 else (
            engines[0].base_url)  # fmt: skip
        self.echo(f"  ready in {time.monotonic() - started:.0f} s")
        self.serving, self.key = Serving(url=url, engines=engines), key
        return self.serving

    def _start(self, i: int, flags: list[str]) -> EngineInfo:
        manager = EngineManager(state_dir=self.state_dir / f"replica-{i}")
        info = manager.start(port=free_port(), flags=flags, timeout_s=900)
        self._up.callback(manager.stop, info.port)
        return info

    def stop(self) -> None:
        """Stop the running engines and router, if any."""
        self._up.close()
        self.serving = self.key = self.measured = None

    async def run(self, scenarios: list[Scenario]) -> list[Ran]:
        """Every scenario in order; the engine stopped at the end."""
        try:
            return [await self.one(s, i, len(scenarios)) for i, s in enumerate(scenarios, 1)]
        finally:
            self.stop()

    async def one(self, scenario: Scenario, i: int, of: int) -> Ran:
        """Induce, diagnose and grade one scenario."""
        self.echo(f"[{i}/{of}] {scenario.name}: {scenario.title}")
        serving = self._serve(scenario)
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session,
            httpx.AsyncClient(timeout=60) as http,
        ):
            client = Client(serving.url, serving.engines, session, http)
            measured = await self._measure(client, scenario)
            streams = streams_of(scenario, measured)
            window_s = window_of(scenario, measured, streams)
            runbooks = sized(self.runbooks, window_s)
            self.echo(f"  {len(streams)} clients, a {window_s:.1f} s window"
                      + (f", {scenario.fault.cpu_hogs} CPU hogs beside" if scenario.fault.cpu_hogs
                         else ""))  # fmt: skip
            rules = await self._in_force(scenario, client, measured, runbooks, serving, http)
            async with self._front(scenario, serving, measured) as gateway_url:
                client.url = gateway_url or serving.url  # the load enters where users' does
                with fault(scenario):
                    started = time.monotonic()
                    diagnosis, sent = await client.under(streams, lambda: self._diagnose(
                        serving, runbooks, scenario, http, gateway_url, rules))  # fmt: skip
                    elapsed = time.monotonic() - started
            fixed = await self._fix(scenario, client, streams) if scenario.fix else None
        if client.refused:
            self.echo(f"  {client.refused} of {client.sent} requests refused at admission")
        loaded = runbooks.select(scenario.alert)
        assert loaded is not None  # _diagnose refused an alert no runbook takes
        graded = grade(
            scenario, {c.cause: c.verdict for c in diagnosis.causes},
            offered=[m.adr.id for m in diagnosis.matches], extra_s=max(0.0, elapsed - window_s),
            window_s=window_s, sent=sent, fix=fixed,
        )  # fmt: skip
        self.echo(f"  grade {graded.grade}: {graded.why}")
        return Ran(graded=graded, diagnosis=diagnosis, runbook=loaded)

    async def _fix(self, scenario: Scenario, client: Client, streams: list[Stream]) -> FixOutcome:
        """Try the scenario's fix behind its ADR's gates, beside the scenario's load; the
        engine is left serving the fix (the next scenario starts its own)."""
        spec = scenario.fix
        assert spec is not None
        found = self.adrs.find(spec.adr)
        if found is None:
            raise UsageError(f"{scenario.name}: fix: no ADR {spec.adr} among the ADRs given "
                             "(the scenarios' adr/ directory, or --adrs)")  # fmt: skip
        adr = found[1]

        async def fixed() -> str:
            flags = tuple(with_flags(list(scenario.engine), adr.fix.engine_args))
            self.echo(f"  the fix: {adr.id}'s {flags_text(adr.fix.engine_args)}, behind its "
                      "gates; restarting the engine …")  # fmt: skip
            serving = self._serve_key((flags, 1, ()))
            client.url, client.engines = serving.url, serving.engines
            return serving.url

        async def under_load(during: Callable[[], Awaitable[Judged]]) -> Judged:
            return (await client.under(streams, during))[0]

        self.echo(f"  the before-run: {spec.num_requests} canary requests beside the load …")
        outcome = await judge_fix(adr, spec, before_url=client.url, fixed=fixed,
                                  under_load=under_load)  # fmt: skip
        self.echo(f"  the gate {'kept' if outcome.kept else 'rolled back'} {adr.id} "
                  f"({outcome.said}): {'right' if outcome.right else 'WRONG'}")  # fmt: skip
        return outcome

    async def _measure(self, client: Client, scenario: Scenario) -> Measured:
        """What this engine does alone (once per engine; the step prompt when first needed)."""
        needs_step = any(s.prompt == "step" for s in scenario.streams)
        if self.measured is None or (needs_step and self.measured.step_prompt_s is None):
            budget = scenario.flag("max-num-batched-tokens", DEFAULT_STEP_BUDGET)
            self.measured = await measure(client, step_budget=budget, step_prompt=needs_step)
            self.echo(f"  measured: a chat alone {self.measured.chat_s:.2f} s" + (
                f", a {self.measured.step_prompt}-token prompt alone "
                f"{self.measured.step_prompt_s:.2f} s" if self.measured.step_prompt_s else ""
            ))  # fmt: skip
        return self.measured

    @contextlib.asynccontextmanager
    async def _front(self, scenario: Scenario, serving: Serving, m: Measured
                     ) -> AsyncIterator[str | None]:  # fmt: skip
        """`ruleloop gateway` in front of the engines where the scenario has one (and the
        delay between them); its URL, None without one."""
        if scenario.gateway is None:
            yield None
            return
        delay = max(MIN_DELAY_S, scenario.gateway.delay_chats * m.chat_s)
        async with contextlib.AsyncExitStack() as stack:
            upstream = serving.url
            if scenario.gateway.delay_chats:
                upstream = await stack.enter_async_context(delayed(upstream, delay))
                self.echo(f"  a {1000 * delay:.0f} ms delay between the gateway and the engine")
            yield stack.enter_context(gateway(upstream))

    async def _in_force(self, scenario: Scenario, client: Client, m: Measured,
                        runbooks: RunbookSet, serving: Serving, http: httpx.AsyncClient
                        ) -> RulesInForce | None:  # fmt: skip
        """The rule in force where the scenario has one: the first accepted ADR, its workload
        captured under the proven traffic; with ``drift_check``, the drift job's comparison of
        the incident's traffic with it (before the alert, as production's job runs)."""
        if scenario.proven is None:
            return None
        accepted = self.adrs.accepted()
        if not accepted:
            raise UsageError(f"{scenario.name}: proven: needs an accepted ADR to be the rule in "
                             "force (--adrs names a directory without one)")  # fmt: skip

        async def shape_under(streams: list[Stream]) -> WorkloadShape:
            look, _ = await client.under(streams, lambda: self._diagnose(
                serving, runbooks, scenario, http, None, None))  # fmt: skip
            if look.workload is None:
                raise LoadFailed(f"{scenario.name}: no workload shape in the window (no request "
                                 "finished): give a longer window")  # fmt: skip
            return look.workload

        shape = await shape_under(streams_of(scenario, m, scenario.proven.streams))
        rule = accepted[0].model_copy(update={"workload": shape})
        self.echo(f"  the rule in force, {rule.id}, proven on: {context_line(shape)}")
        if not scenario.proven.drift_check:
            return RulesInForce(adrs=(rule,))
        found = diff(shape, await shape_under(streams_of(scenario, m)), rate=False)
        moved = [d.line for d in found.dimensions if d.drifted]
        self.echo(f"  the drift job: {'; '.join(moved) if moved else 'alike'}")
        check = DriftCheck(at=dt.datetime.now(dt.UTC), checked=(rule.id,),
                           drifted={rule.id: moved} if moved else {})  # fmt: skip
        return RulesInForce(adrs=(rule,), drift=check)

    async def _diagnose(self, serving: Serving, runbooks: RunbookSet, scenario: Scenario,
                        http: httpx.AsyncClient, gateway_url: str | None,
                        rules: RulesInForce | None) -> Diagnosis:  # fmt: skip
        if runbooks.select(scenario.alert) is None:
            raise UsageError(f"{scenario.name}: no runbook takes the alert {scenario.alert}")
        registry = default_registry()
        diagnoser = Diagnoser(
            runbooks=runbooks, runner=RunbookRunner(registry=registry), adrs=self.adrs,
            context=lambda: ProbeContext(http=http), clock=lambda: dt.datetime.now(dt.UTC),
            rules=None if rules is None else _reader(rules),
        )  # fmt: skip
        # the step budget as the team would configure it: the flag the engine runs with
        budget = scenario.flag("max-num-batched-tokens", 0) or None
        fleet = [e.base_url for e in serving.engines] if len(serving.engines) > 1 else []
        spec = Target(vllm_url=serving.url, replicas=fleet, step_budget=budget,
                      gateway_url=gateway_url)  # fmt: skip
        target = TargetRef(scenario.name, spec)
        return await diagnoser.diagnose(target, labels=scenario.alert)


def _reader(rules: RulesInForce) -> Callable[[str], Awaitable[RulesInForce]]:
    async def read(target: str) -> RulesInForce:
        return rules

    return read


def run_catalogue(scenarios: list[Scenario], *, runbooks: RunbookSet, adrs: AdrStore,
                  state_dir: Path, echo: Echo) -> list[Ran]:  # fmt: skip
    """Run ``scenarios`` (bot.eval.scenario.load_catalogue) and grade each: ``adrs`` are the
    rules a diagnosis may offer and the fixes scenarios try."""
    catalogue = Catalogue(runbooks=runbooks, adrs=adrs, state_dir=state_dir, echo=echo)
    return asyncio.run(catalogue.run(scenarios))
