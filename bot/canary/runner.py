"""Runs a canary: preflight, load at fixed concurrency or Poisson rate, in-flight sampling.

The engine is scraped once before and once after the load (the window), and every
``sample_interval_s`` during it, when the fragmentation samples are taken.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from dataclasses import fields as dataclass_fields

import aiohttp
import httpx
import msgspec

from bot.adr.workload import WorkloadShape
from bot.canary.client import Outcome, RequestRecord, stream_request
from bot.canary.fleet import FleetScraper, Round
from bot.canary.plan import Plan
from bot.canary.report import CanaryMeasurement, samples_of
from bot.canary.schema import TimelinePoint
from bot.canary.shape_replay import DEFAULT_BLOCK_SIZE, ShapeReplay, fixed_shape
from bot.canary.verdict import Gates, undecided
from bot.canary.workload import Api, CancelMode, PromptFactory, Workload
from bot.diagnosis.probes import (
    CACHE_CONFIG,
    GENERATION_TOKENS,
    KV_USAGE,
    RUNNING,
    SAMPLE_METRICS,
    WAITING,
    CacheConfig,
    EngineWindow,
    Exposition,
    FragmentationSample,
    MetricsScraper,
    cache_config,
    gauge,
    internal_fragmentation,
    kv_blocks_used,
    kv_usage,
    observed_fragmentation,
    read_window,
    resident_lengths,
)
from bot.kernel import EndpointError
from bot.kernel.runtime.redact import redact

SETTLE_TIMEOUT_S = 5.0
# Request bodies encoded before the measured window opens (as vLLM's own benchmark builds its
# dataset first), up to this many; a longer or open-ended run encodes the rest as it goes.
PREPARED_BODIES = 20_000
# Where an engine's /metrics may be, relative to the endpoint's host: the engine itself, or a
# ruleloop gateway in front of it (which serves the upstream engine's page at /engine/metrics).
METRICS_PATHS = ("/metrics", "/engine/metrics")
# What a replay reads from /metrics before it plans: the KV block size and prefix caching.
REPLAY_METRICS = frozenset((*CACHE_CONFIG, *GENERATION_TOKENS))
Scraper = MetricsScraper | FleetScraper  # one engine's page, or every replica's merged


class _Quota:
    """How many more requests a load may start: up to ``count``, and until ``deadline``."""

    __slots__ = ("count", "deadline", "issued")

    def __init__(self, count: int | None, deadline: float | None) -> None:
        self.count, self.deadline, self.issued = count, deadline, 0

    @property
    def counted_out(self) -> bool:
        """All ``count`` requests have started."""
        return self.count is not None and self.issued >= self.count

    def take(self) -> bool:
        """Start one more request, if the count and the deadline leave room for it."""
        if self.counted_out:
            return False
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            return False
        self.issued += 1
        return True


@dataclass(frozen=True)
class Progress:
    """A snapshot for the progress line."""

    elapsed_s: float
    done: int
    in_flight: int
    failed: int
    cancelled: int
    target: int | None
    tokens: int


class CanaryRun:
    """One canary run against one endpoint; ``run()`` returns the report."""

    def __init__(
        self,
        workload: Workload,
        *,
        gates: Gates | None = None,
        metrics_url: str | None = None,
        discover_metrics: bool = False,
        sample_interval_s: float = 1.0,
        on_progress: Callable[[Progress], None] | None = None,
        progress_interval_s: float = 1.0,
        replicas: Sequence[str] = (),
        size: bool = True,
    ) -> None:
        self.gates = gates or Gates()
        self.warnings: list[str] = []
        sequential = size and workload.num_requests is not None and self.gates.statistical()
        if not sequential:  # a count given as a bound, a run bounded by time: one look
            self.gates = replace(self.gates, looks=1)
        self.workload = self._sized(workload, size)
        self._target = self.workload.num_requests  # grows at a look that goes on
        self.replicas = list(replicas)  # engines behind the endpoint, read merged (--replica)
        self.metrics_url = metrics_url
        self.discover_metrics = discover_metrics and metrics_url is None
        self.sample_interval_s = sample_interval_s
        self._on_progress = on_progress
        self._progress_interval_s = progress_interval_s
        self._rng = random.Random(workload.seed + 1)
        # Every run sends prompts of its own: a run that re-sent an earlier run's prompts would be
        # served from the engine's prefix cache, and two runs would no longer measure alike.
        self._salt = secrets.token_hex(8)
        self._prompts = PromptFactory(workload, salt=self._salt)
        self.records: list[RequestRecord] = []
        self.samples: list[FragmentationSample] = []
        self.timeline: list[TimelinePoint] = []
        self._cache: CacheConfig | None = None
        self._started = 0.0
        self._prepared: deque[tuple[bytes, int]] = deque()
        self._max_model_len: int | None = None  # the engine's, from /v1/models
        self.replay: ShapeReplay | None = None  # the measured requests of a --workload replay
        self._warmup_replay: ShapeReplay | None = None  # its warmup: same prefixes, own draws
        self._first_token = asyncio.Event()  # a measured stream got its first token

    def _sized(self, workload: Workload, size: bool) -> Workload:
        """The workload with at least as many requests as its gates can be decided on
        (``Gates.requests_needed``: a p99 against a limit needs 528 at 99 %); a run bounded by
        time only, or a count given as a bound (``size`` False), is left as it is, said, and
        its verdict says when it was too short to decide."""
        needed = self.gates.requests_needed()
        if workload.num_requests is None or workload.num_requests >= needed:
            return workload
        if not size:
            self.warnings.append(
                f"{workload.num_requests} requests cannot decide the gates at"
                f" {self.gates.confidence:.0%} ({needed} can): a gate not missed will be"
                " inconclusive, and fail"
            )
            return workload
        self.warnings.append(
            f"sized {workload.num_requests} -> {needed} requests: the gates cannot be decided at"
            f" {self.gates.confidence:.0%} on fewer"
        )
        return replace(workload, num_requests=needed)

    async def run(self) -> CanaryMeasurement:
        """Preflight, load, scrape; raise EndpointError when the endpoint cannot be used."""
        w = self.workload
        # httpx for the few control calls (preflight, /tokenize, /metrics); aiohttp for the
        # streams (see bot.canary.client). Whole-request deadlines live in stream_request.
        paced = w.request_rate is not None or w.shape is not None
        connector = aiohttp.TCPConnector(limit=0 if paced else w.concurrency + 4)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0)
        async with (
            httpx.AsyncClient(timeout=10.0) as client,
            aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        ):
            model = await self._preflight(client)
            scraper = await self._metrics(client)
            if w.api is Api.CHAT:
                await self._calibrate_chat(client, model)
            if w.shape is not None:
                await self._start_replay(w.shape, scraper)
            if w.warmup_requests:
                await self._load(
                    session, model, count=w.warmup_requests, duration_s=None, keep=False
                )
            self._prepare(model, min(w.num_requests or 0, PREPARED_BODIES))
            before = await scraper() if scraper else None
            before_round = scraper.last if isinstance(scraper, FleetScraper) else None
            self._cache = cache_config(before) if before else None
            cpu0, wall0 = time.process_time(), time.perf_counter()
            self._started = wall0
            sampler = asyncio.create_task(self._sample(scraper)) if scraper else None
            ticker = asyncio.create_task(self._tick()) if self._on_progress else None
            try:
                await self._looks(session, model)
            finally:
                for task in (sampler, ticker):
                    if task:
                        task.cancel()
            wall_s, cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
            after = await self._settled(scraper) if scraper else None
        self._fail_if_nothing_worked()
        window, details = self._engine_window(scraper, before, after, before_round)
        return CanaryMeasurement(
            shape=self._shape(wall_s),
            workload=self._workload_dict(model, scraper),
            records=self.records,
            engine=window,
            samples=self.samples,
            gates=self.gates,
            wall_s=wall_s,
            client_cpu_s=cpu_s,
            timeline=self.timeline,
            warnings=self.warnings,
            replicas=len(self.replicas),
            replica_details=details,
        )

    async def _looks(self, session: aiohttp.ClientSession, model: str) -> None:
        """The measured load, look by look: the sized count first; while a gate is undecided
        and looks are left, as many requests again as the run has sent (2x, 4x ...)."""
        w = self.workload
        await self._load(session, model, count=w.num_requests, duration_s=w.duration_s, keep=True)
        for look in range(2, self.gates.looks + 1):
            sent = len(self.records)
            left = undecided(samples_of(self.records), self.gates)
            if not left:
                return
            self.warnings.append(
                f"look {look - 1} of {self.gates.looks}: {', '.join(left)} not decided on"
                f" {sent} requests; {sent} more"
            )
            self._target = 2 * sent
            self._prepare(model, min(sent, PREPARED_BODIES))
            await self._load(session, model, count=sent, duration_s=None, keep=True)

    def _engine_window(
        self, scraper: Scraper | None, before: Exposition | None, after: Exposition | None,
        before_round: Round | None,
    ) -> tuple[EngineWindow | None, dict[str, object]]:  # fmt: skip
        """The engine's window of the run: one page's, or the replicas' merged (with each
        replica's numbers, and what went wrong with any, as warnings)."""
        if isinstance(scraper, FleetScraper) and before_round and scraper.last:
            fleet = scraper.window(before_round, scraper.last)
            self.warnings.extend(
                f"replica {r.replica.address}: {note}" for r in fleet.replicas for note in r.notes
            )
            return fleet.window.engine, {r.replica.address: r.summary() for r in fleet.replicas}
        return (read_window(before, after) if before and after else None), {}

    def _shape(self, wall_s: float) -> WorkloadShape:
        """The shape the run sent: the replayed one, or the fixed workload's."""
        w = self.workload
        if w.shape is not None:
            return w.shape
        rate = max(len(self.records), 1) / wall_s if wall_s > 0 else None
        count = len(self.records) or None
        return fixed_shape(w, request_rate=rate, count=count, max_model_len=self._max_model_len)

    def _workload_dict(self, model: str, scraper: Scraper | None) -> dict[str, object]:
        """The workload as the JSON report lists it."""
        w = self.workload
        fields = {f.name: getattr(w, f.name) for f in dataclass_fields(w)}
        workload = {k: (v.value if hasattr(v, "value") else v) for k, v in fields.items()}
        workload["endpoint"] = redact(w.endpoint)  # the report is stored and shown
        workload["model"] = model
        workload["metrics_url"] = redact(scraper.url) if scraper else None
        workload["pattern"] = pattern(w)
        workload["shape"] = None if w.shape is None else w.shape.source
        if self.replay is not None:
            # The fixed parameters do not apply: the shape's draws do (under "replay").
            for key in ("prompt_length", "prefix_length", "output_length"):
                workload[key] = None
            workload["request_rate"] = w.shape.arrivals.request_rate if w.shape else None
            workload["replay"] = self.replay.describe()
        return workload

    async def _start_replay(self, shape: WorkloadShape, scraper: Scraper | None) -> None:
        """Plan the replay with the engine's limits: max_model_len and the KV block size."""
        w = self.workload
        block_size, caching = None, None
        if scraper is not None:
            try:
                page = await scraper(only=REPLAY_METRICS)
            except EndpointError:
                page = None
            if page is not None:
                cache = cache_config(page)
                block_size = cache.block_size if cache else None
                caching = prefix_caching(page)
        needs_prefix = bool(shape.prefix.groups or shape.prefix.hit_rate)
        if block_size is None and needs_prefix:
            self.warnings.append(
                "the engine's KV block size is unknown (no vllm:cache_config_info): prefixes "
                f"for the shape's hit rate assume {DEFAULT_BLOCK_SIZE}-token blocks"
            )
        if caching is False and needs_prefix:
            self.warnings.append(
                "the engine runs without prefix caching (enable_prefix_caching=False): the "
                "shape's shared prefixes are sent but cannot hit"
            )
        if self._max_model_len is None:
            self.warnings.append(
                "/v1/models gives no max_model_len: the shape's lengths are not clamped to it"
            )
        if shape.api in ("completions", "chat") and shape.api != w.api.value:
            self.warnings.append(
                f"the shape was captured on the {shape.api} API; replaying it on {w.api.value}"
            )
        self.replay, self._warmup_replay = (
            ShapeReplay(
                shape,
                seed=w.seed,
                count=count,
                max_model_len=self._max_model_len,
                block_size=block_size,
                stream=stream,
                salt=self._salt,
                warm=warm,
            )
            for count, stream, warm in (
                (w.num_requests, "measured", w.warmup_requests > 0),
                (w.warmup_requests, "warmup", False),
            )
        )

    async def _metrics(self, client: httpx.AsyncClient) -> Scraper | None:
        """The engine's /metrics: every replica's, or the one given, or found beside the
        endpoint, or none."""
        if self.replicas:
            return FleetScraper(self.replicas, client=client)
        if self.metrics_url is not None:
            return MetricsScraper(self.metrics_url, client=client)
        if not self.discover_metrics:
            return None
        tried = []
        for path in METRICS_PATHS:
            scraper = MetricsScraper(self.workload.base_url + path, client=client)
            try:
                await scraper(only=SAMPLE_METRICS)
            except EndpointError as exc:
                tried.append(str(exc))
                continue
            return scraper
        # Found on our own and not vLLM's: measure client-side rather than refuse to run.
        self.warnings.append(
            "no vLLM /metrics page beside the endpoint ("
            + "; ".join(tried)
            + "). Numbers are client-side only: goodput is an upper bound and KV fragmentation "
            "is not measured. Pass --metrics-url with the engine's /metrics to fix this."
        )
        return None

    async def _preflight(self, client: httpx.AsyncClient) -> str:
        """Check the endpoint speaks the OpenAI API and find the model to ask for."""
        url = f"{self.workload.base_url}/v1/models"
        shown = redact(url)  # what errors say: never a URL's credentials
        try:
            response = await client.get(url, timeout=10.0)
        except httpx.HTTPError as exc:
            raise EndpointError(
                redact(f"cannot reach {shown}: {exc or type(exc).__name__}")
            ) from exc
        try:
            models = [m["id"] for m in response.json()["data"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise EndpointError(
                f"{shown} answered HTTP {response.status_code} without an OpenAI model list; "
                "is --endpoint an OpenAI-compatible server (vLLM, or a gateway in front of it)?"
            ) from exc
        if self.workload.model:
            chosen = self.workload.model
        elif not models:
            raise EndpointError(f"{shown} lists no models; pass --model")
        else:
            chosen = str(models[0])
        for entry in response.json()["data"]:
            if entry.get("id") == chosen and isinstance(entry.get("max_model_len"), int):
                self._max_model_len = entry["max_model_len"]
        return chosen

    async def _calibrate_chat(self, client: httpx.AsyncClient, model: str) -> None:
        """Measure tokens per prompt word with vLLM's /tokenize so chat prompts hit the length."""
        sample = " ".join("abcdefghij" * 10)
        try:
            response = await client.post(
                f"{self.workload.base_url}/tokenize",
                json={"model": model, "prompt": sample, "add_special_tokens": False},
            )
            count = int(response.json()["count"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return  # not vLLM: keep one token per word
        self._prompts.tokens_per_word = max(count / 100, 0.1)

    async def _load(
        self,
        session: aiohttp.ClientSession,
        model: str,
        *,
        count: int | None,
        duration_s: float | None,
        keep: bool,
    ) -> None:
        """Send up to ``count`` requests or for ``duration_s``: at fixed concurrency, or as
        arrivals (Poisson at the request rate, or the replayed shape's)."""
        deadline = None if duration_s is None else time.perf_counter() + duration_s
        quota = _Quota(count, deadline)
        replay = self.replay if keep else self._warmup_replay
        if self.workload.request_rate is None and replay is None:
            await self._closed_loop(session, model, quota, keep=keep)
            return
        await self._arrivals(session, model, quota, replay, keep=keep)
        if keep and self.replay is not None:
            self.warnings.extend(self.replay.warnings())

    async def _closed_loop(
        self, session: aiohttp.ClientSession, model: str, quota: _Quota, *, keep: bool
    ) -> None:
        """Fixed concurrency: each stream sends its next request when its last one ends (a
        pulse's burst streams only inside a burst)."""
        w = self.workload
        started = time.perf_counter()
        base = w.base_streams() if keep else w.concurrency

        async def worker(index: int) -> None:
            while True:
                # A burst stream (pulse) sends only inside a burst: re-checked after every
                # sleep, since a busy loop may wake it after the burst has ended.
                while index >= base and not w.in_burst(time.perf_counter() - started):
                    wait = w.next_burst_in(time.perf_counter() - started)
                    if quota.deadline is not None and time.perf_counter() + wait >= quota.deadline:
                        return
                    if quota.counted_out:
                        return
                    await asyncio.sleep(wait)
                if not quota.take():
                    return
                await self._one(session, model, keep=keep)

        await asyncio.gather(*(worker(i) for i in range(w.concurrency)))

    async def _arrivals(
        self,
        session: aiohttp.ClientSession,
        model: str,
        quota: _Quota,
        replay: ShapeReplay | None,
        *,
        keep: bool,
    ) -> None:
        """Requests at their own arrival times (the shape's gaps, else Poisson at the request
        rate), at most ``concurrency`` of them in flight."""
        w = self.workload
        gate = asyncio.Semaphore(w.concurrency)
        tasks = []

        async def gated() -> None:
            async with gate:
                await self._one(session, model, keep=keep)

        rate = w.request_rate or 1.0
        while quota.take():
            tasks.append(asyncio.create_task(gated()))
            await asyncio.sleep(replay.gap() if replay else self._rng.expovariate(rate))
        await asyncio.gather(*tasks)

    def _prepare(self, model: str, count: int) -> None:
        """Encode ``count`` request bodies now, so their cost stays out of the measured CPU."""
        self._prepared = deque(self._encoded(model) for _ in range(count))

    def _encoded(self, model: str, *, keep: bool = True) -> tuple[bytes, int]:
        """One request body as JSON bytes, and its planned prompt length in tokens."""
        replay = self.replay if keep else self._warmup_replay
        plan: Plan | None = replay.plan() if replay is not None else None
        body = self._prompts.body(model, plan)
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            planned = len(prompt)
        else:
            planned = self.workload.prompt_length if plan is None else plan.prompt_tokens
        return msgspec.json.encode(body), planned

    async def _one(self, session: aiohttp.ClientSession, model: str, *, keep: bool) -> None:
        w = self.workload
        body, planned = (
            self._prepared.popleft() if keep and self._prepared else self._encoded(model, keep=keep)
        )
        cancel = w.cancel_share > 0 and self._rng.random() < w.cancel_share
        headers, abandon, after_tokens = None, None, None
        if cancel and w.cancel_mode is CancelMode.HEADER:
            headers = {"X-Request-Timeout": f"{w.cancel_after_ms:g}ms"}
        elif cancel and w.cancel_after_tokens is not None:
            after_tokens = w.cancel_after_tokens
        elif cancel:
            abandon = w.cancel_after_ms / 1000
        record = RequestRecord(sent_at=time.perf_counter(), planned_prompt_tokens=planned)
        if keep:
            self.records.append(record)
        await stream_request(
            session,
            self.workload.endpoint,
            body,
            record,
            headers=headers,
            abandon_after_s=abandon,
            cancel_after_tokens=after_tokens,
            timeout_s=w.timeout_s,
            on_first_token=self._first_token.set if keep else None,
        )
        if cancel and headers and record.outcome is Outcome.FAILED:
            record.outcome = Outcome.CANCELLED  # the deadline we asked for did its job

    async def _sample(self, scraper: Scraper) -> None:
        # The first sample is taken as soon as a measured stream holds a token: on a fast
        # engine a short run can end within one interval, and would have no sample at all.
        await self._first_token.wait()
        while True:
            # What is resident when the engine renders the page, not when its answer arrives.
            prefilled = self._in_flight()
            try:
                page = await scraper(only=SAMPLE_METRICS)
            except EndpointError:
                pass  # one missed sample is not worth failing the run
            else:
                self._take_sample(page, prefilled)
            await asyncio.sleep(self.sample_interval_s)

    def _in_flight(self) -> list[tuple[int, int]]:
        """(prompt, generated - 1) of each streaming request that has its first token."""
        # The newest sampled token has no KV yet: it is written when the next step feeds it in.
        return [
            (r.prompt_tokens or r.planned_prompt_tokens, max(r.output_tokens - 1, 0))
            for r in self.records
            if r.in_flight and r.first_token_at is not None
        ]

    def _take_sample(self, page: Exposition, prefilled: list[tuple[int, int]]) -> None:
        # A merged page holds one usage share per replica: the fullest, never their sum.
        kv = kv_usage(page) if self.replicas else gauge(page, KV_USAGE)
        cache = self._cache
        shared = 0
        if cache and self.replay is None:  # a replay's prefixes vary: counted as not shared
            shared = self.workload.prefix_length // cache.block_size * cache.block_size
        lengths, resident = resident_lengths(prefilled, shared_prefix=shared)
        now = time.perf_counter() - self._started
        self.timeline.append(
            TimelinePoint(
                t_s=now,
                running=gauge(page, RUNNING),
                waiting=gauge(page, WAITING),
                kv_usage=kv,
                resident_tokens=resident,
            )  # fmt: skip
        )
        if cache is None or kv is None:
            return
        usage, pool = kv, cache.num_gpu_blocks
        if self.replicas:
            # The canary's tokens sit on every replica: over the blocks all of them use, each
            # replica's from its own usage and pool (a full pool of that many, usage 1).
            blocks = kv_blocks_used(page)
            if blocks is None:
                return
            usage, pool = 1.0, blocks + 1
        self.samples.append(
            FragmentationSample(
                at=now,
                observed=observed_fragmentation(
                    resident_tokens=resident,
                    kv_usage=usage,
                    num_gpu_blocks=pool,
                    block_size=cache.block_size,
                ),
                internal=internal_fragmentation(lengths, cache.block_size),
                resident_tokens=resident,
                kv_usage=kv,
            )
        )

    async def _settled(self, scraper: Scraper) -> Exposition:
        """Scrape until the engine has no request left, so aborted work is fully counted."""
        deadline = time.perf_counter() + SETTLE_TIMEOUT_S
        while True:
            page = await scraper()
            busy = (gauge(page, RUNNING) or 0) + (gauge(page, WAITING) or 0)
            if busy == 0 or time.perf_counter() > deadline:
                return page
            await asyncio.sleep(0.1)

    async def _tick(self) -> None:
        assert self._on_progress is not None
        while True:
            await asyncio.sleep(self._progress_interval_s)
            self._on_progress(self.progress())

    def progress(self) -> Progress:
        """Where the run stands now."""
        counts = {o: 0 for o in Outcome}
        in_flight = tokens = 0
        for record in self.records:
            tokens += record.output_tokens
            if record.outcome is None:
                in_flight += 1
            else:
                counts[record.outcome] += 1
        return Progress(
            elapsed_s=time.perf_counter() - self._started,
            done=len(self.records) - in_flight,
            in_flight=in_flight,
            failed=counts[Outcome.FAILED],
            cancelled=counts[Outcome.CANCELLED],
            target=self._target,
            tokens=tokens,
        )

    def _fail_if_nothing_worked(self) -> None:
        if not self.records or any(r.outcome is not Outcome.FAILED for r in self.records):
            return
        errors = sorted({r.error or "unknown error" for r in self.records})
        raise EndpointError(
            f"all {len(self.records)} requests to {self.workload.endpoint} failed: {errors[0]}"
            + (f" (and {len(errors) - 1} other errors)" if len(errors) > 1 else "")
        )


def prefix_caching(page: Exposition) -> bool | None:
    """Whether the engine caches prefixes (vllm:cache_config_info), None when not exposed."""
    name = page.first_present(CACHE_CONFIG)
    for labels in page.labels_of(name) if name else []:
        value = labels.get("enable_prefix_caching")
        if value is not None:
            return value.lower() == "true"
    return None


def pattern(workload: Workload) -> dict[str, object]:
    """The load's shape, for the JSON report."""
    if workload.shape is not None:
        arrivals = workload.shape.arrivals
        return {
            "kind": "shape",
            "requests_per_s": arrivals.request_rate,
            "burstiness": arrivals.burstiness,
            "max_in_flight": workload.concurrency,
        }
    if workload.request_rate is not None:
        return {"kind": "poisson", "requests_per_s": workload.request_rate,
                "max_in_flight": workload.concurrency}  # fmt: skip
    if workload.pulse_period_s is None:
        return {"kind": "steady", "streams": workload.concurrency}
    return {
        "kind": "pulse",
        "base_streams": workload.base_streams(),
        "peak_streams": workload.concurrency,
        "period_s": workload.pulse_period_s,
        "burst_s": workload.pulse_width_s,
    }
