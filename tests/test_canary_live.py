"""The live canary (bot/canary/live.py) on /metrics pages scripted at the wire: two baseline
replicas and one canary replica, each page one more interval of traffic. An equal canary is
kept, a slower one rolled back, too few requests and a canary that stops answering cannot be
judged; the U statistic against a hand-computed case and against ranks of the expanded values
(and scipy where the venv has it). The CLI's exit codes on the same pages."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from bot.app.cli import cli
from bot.canary import live
from bot.canary.live import LiveVerdict, analyse
from bot.canary.stats import u_test
from bot.diagnosis.probes.context import ProbeContext
from bot.diagnosis.probes.replicas import Replica
from bot.kernel.config import Target

EDGES = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)
FAST_TTFT = {0.02: 4, 0.04: 5, 0.06: 1}  # observations per bucket, per scrape interval
SLOW_TTFT = {0.1: 2, 0.25: 6, 0.5: 2}
FAST_TPOT = {0.01: 7, 0.02: 3}
SLOW_TPOT = {0.02: 2, 0.04: 8}
BASELINE = ("http://10.0.0.7:8000", "http://10.0.0.8:8000")
CANARY = "http://10.0.0.9:8000"
SCRAPES = 7  # six intervals of ten requests: 60 per replica, over MIN_REQUESTS


def histogram(name: str, observations: Mapping[float, int], times: int) -> list[str]:
    lines, running = [f"# TYPE {name} histogram"], 0
    for edge in EDGES:
        running += observations.get(edge, 0) * times
        lines.append(f'{name}_bucket{{engine="0",le="{edge}"}} {running}')
    lines += [f'{name}_bucket{{engine="0",le="+Inf"}} {running}',
              f'{name}_count{{engine="0"}} {running}', f'{name}_sum{{engine="0"}} {running * 0.1}']  # fmt: skip
    return lines


def page(ttft: Mapping[float, int], tpot: Mapping[float, int], *, started: float, n: int) -> str:
    """A replica's page after ``n`` intervals of traffic."""
    lines = [
        "# TYPE process_start_time_seconds gauge", f"process_start_time_seconds {started}",
        "# TYPE vllm:generation_tokens counter",
        f'vllm:generation_tokens_total{{engine="0"}} {16 * n * sum(ttft.values())}',
        *histogram("vllm:time_to_first_token_seconds", ttft, n),
        *histogram("vllm:request_time_per_output_token_seconds", tpot, n),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


class Fleet:
    """Each replica's /metrics, one more interval of its traffic at each scrape; a replica in
    ``silent_after`` answers 503 after that many scrapes."""

    def __init__(self, traffic: Mapping[str, tuple[Mapping[float, int], Mapping[float, int]]],
                 silent_after: Mapping[str, int] | None = None) -> None:  # fmt: skip
        self.traffic = {httpx.URL(url).netloc.decode(): t for url, t in traffic.items()}
        self.silent_after = {httpx.URL(u).netloc.decode(): n for u, n in (silent_after or {}).items()}  # fmt: skip
        self.scrapes = dict.fromkeys(self.traffic, 0)

    def handler(self, request: httpx.Request) -> httpx.Response:
        host = request.url.netloc.decode()
        if request.url.path != "/metrics" or host not in self.traffic:
            return httpx.Response(404)
        if self.scrapes[host] >= self.silent_after.get(host, math.inf):
            return httpx.Response(503, text="gone")
        self.scrapes[host] += 1
        ttft, tpot = self.traffic[host]
        started = 1000.0 + list(self.traffic).index(host)  # one engine process each
        return httpx.Response(200, text=page(ttft, tpot, started=started, n=self.scrapes[host]))


TARGET = Target(vllm_url="http://10.0.0.5:8000", replicas=list(BASELINE), canary_replicas=[CANARY])


async def verdict_of(fleet: Fleet, target: Target = TARGET) -> LiveVerdict:
    now = [0.0]

    async def sleep(seconds: float) -> None:
        now[0] += seconds

    async with httpx.AsyncClient(transport=httpx.MockTransport(fleet.handler)) as http:
        ctx = ProbeContext(http=http, monotonic=lambda: now[0], sleep=sleep)
        return await analyse("prod", target, ctx, seconds=SCRAPES - 1, interval_s=1)


def healthy(canary: tuple[Mapping[float, int], Mapping[float, int]]) -> Fleet:
    return Fleet({**{url: (FAST_TTFT, FAST_TPOT) for url in BASELINE}, CANARY: canary})


async def test_an_equal_canary_is_kept() -> None:
    verdict = await verdict_of(healthy((FAST_TTFT, FAST_TPOT)))
    assert verdict.decision == "keep" and verdict.exit_code == 0, verdict.text()
    ttft, tpot = verdict.metrics
    assert (ttft.name, tpot.name) == ("TTFT", "TPOT")
    # each group's histograms merged on their own: two baseline replicas, one canary
    assert (ttft.canary.count, ttft.baseline.count) == (60, 120)
    assert ttft.test is not None and ttft.test.p_value > 0.4
    assert "TTFT: canary p50 " in verdict.text() and "(n=60) vs baseline " in verdict.text()


async def test_a_slower_canary_is_rolled_back_with_its_numbers() -> None:
    verdict = await verdict_of(healthy((SLOW_TTFT, FAST_TPOT)))
    assert verdict.decision == "roll back" and verdict.exit_code == 1, verdict.text()
    assert verdict.reason == "the canary is slower in TTFT", verdict.text()
    ttft, tpot = verdict.metrics
    assert ttft.worse and not tpot.worse
    assert ttft.test is not None and ttft.test.p_value < 1e-12
    assert ttft.canary.p99 is not None and ttft.baseline.p99 is not None
    assert ttft.canary.p99 > 5 * ttft.baseline.p99
    first = verdict.text().splitlines()[0]
    assert first == "live canary: ROLL BACK: the canary is slower in TTFT", verdict.text()


async def test_a_slower_decode_is_rolled_back() -> None:
    verdict = await verdict_of(healthy((FAST_TTFT, SLOW_TPOT)))
    assert verdict.decision == "roll back" and verdict.reason.endswith("in TPOT"), verdict.text()


async def test_significant_but_small_is_kept() -> None:
    """Ten times the traffic, a tenth of the canary's requests one bucket later: significant,
    but neither p50 nor p99 is MIN_WORSE worse, so it is kept."""
    busy = {0.02: 40, 0.04: 50, 0.06: 10}
    nudged = {0.02: 30, 0.04: 60, 0.06: 10}
    fleet = Fleet({**{url: (busy, FAST_TPOT) for url in BASELINE}, CANARY: (nudged, FAST_TPOT)})
    verdict = await verdict_of(fleet)
    ttft, _ = verdict.metrics
    assert ttft.test is not None and ttft.test.p_value < live.ALPHA, verdict.text()
    assert verdict.decision == "keep", verdict.text()
    assert ttft.canary.p50 is not None and ttft.baseline.p50 is not None
    assert ttft.canary.p50 > ttft.baseline.p50


async def test_a_slowdown_of_the_tail_alone_is_not_significant_and_is_kept() -> None:
    """The rule's stated limit: one request in ten ten times slower moves the canary's p99,
    not its ranks; the synthetic canary's p99 gates are what catch that (docs/fleet.md)."""
    tail = {0.02: 4, 0.04: 5, 0.5: 1}
    verdict = await verdict_of(healthy((tail, FAST_TPOT)))
    ttft, _ = verdict.metrics
    assert ttft.canary.p99 is not None and ttft.baseline.p99 is not None
    assert ttft.canary.p99 > 5 * ttft.baseline.p99
    assert ttft.test is not None and ttft.test.p_value > live.ALPHA
    assert verdict.decision == "keep", verdict.text()


async def test_too_few_requests_cannot_be_judged() -> None:
    few = ({0.1: 2, 0.25: 3}, {0.02: 5})  # 30 canary requests in the window, and slow
    verdict = await verdict_of(healthy(few))
    assert verdict.decision == "cannot judge" and verdict.exit_code == 2, verdict.text()
    assert f"canary under {live.MIN_REQUESTS} observations" in verdict.text()


async def test_a_canary_that_stops_answering_cannot_be_judged_and_is_named() -> None:
    fleet = healthy((FAST_TTFT, FAST_TPOT))
    fleet.silent_after = {"10.0.0.9:8000": 3}
    verdict = await verdict_of(fleet)
    assert verdict.decision == "cannot judge", verdict.text()
    assert verdict.reason.startswith("not read over the whole window: 10.0.0.9:8000: answered 3 of 7")  # fmt: skip
    assert "503" in verdict.reason


async def test_a_services_endpoints_less_the_canarys_are_the_baseline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Behind one Service the canary's pods are endpoints too: they are not the baseline."""

    async def discovered(target: Target) -> list[Replica]:
        assert target.kubernetes_service == "inference/vllm"
        return [Replica(url, pod=f"vllm-{n}") for n, url in enumerate([*BASELINE, CANARY])]

    monkeypatch.setattr(live, "resolve_replicas", discovered)
    service = Target(vllm_url="http://vllm.inference:8000", kubernetes_service="inference/vllm",
                     canary_replicas=[CANARY])  # fmt: skip
    verdict = await verdict_of(healthy((SLOW_TTFT, FAST_TPOT)), service)
    ttft, _ = verdict.metrics
    assert (ttft.canary.count, ttft.baseline.count) == (60, 120), verdict.text()
    assert verdict.decision == "roll back", verdict.text()


async def test_a_target_without_canary_replicas_cannot_be_judged() -> None:
    plain = Target(vllm_url="http://10.0.0.5:8000", replicas=list(BASELINE))
    verdict = await verdict_of(healthy((FAST_TTFT, FAST_TPOT)), plain)
    assert verdict.decision == "cannot judge" and "lists no canary_replicas" in verdict.reason


def test_a_canary_replica_listed_as_baseline_is_refused() -> None:
    with pytest.raises(ValueError, match=r"10.0.0.8:8000 is both a canary replica and a baseline"):
        Target(vllm_url="http://10.0.0.5:8000", replicas=list(BASELINE), canary_replicas=[BASELINE[1]])  # fmt: skip
    with pytest.raises(ValueError, match="a canary replica is listed twice"):
        Target(vllm_url="http://10.0.0.5:8000", canary_replicas=[CANARY, CANARY + "/"])


def test_u_against_a_hand_computed_case() -> None:
    """Buckets 1, 2, 3: canary {2, 3, 3}, baseline {1, 1, 2}. U counts, for each canary value,
    the baseline values below it and half those tied: 2.5 + 3 + 3 = 8.5. Ties (2 per bucket):
    sum(t^3 - t) = 18, var = 3*3/12 * (7 - 18/30) = 4.8, z = (8.5 - 4.5 - 0.5)/sqrt(4.8)."""
    test = u_test([0, 1, 2], [2, 1, 0])
    assert test.u == 8.5
    assert test.z == pytest.approx(3.5 / math.sqrt(4.8))
    assert test.p_value == pytest.approx(0.0550745, abs=1e-6)
    assert u_test([2, 1, 0], [0, 1, 2]).p_value > 0.95  # faster: one-sided, no evidence
    assert u_test([5, 0], [5, 0]).p_value == 1.0  # all in one bucket: no evidence


def expanded(counts: list[int]) -> list[float]:
    return [float(i) for i, c in enumerate(counts) for _ in range(c)]


def rank_reference(canary: list[int], baseline: list[int]) -> tuple[float, float]:
    """U and one-sided p from average ranks of the expanded values (the textbook way)."""
    x, y = expanded(canary), expanded(baseline)
    pooled = sorted(x + y)
    rank = {v: (pooled.index(v) + 1 + len(pooled) - pooled[::-1].index(v)) / 2 for v in pooled}
    n1, n2, n = len(x), len(y), len(pooled)
    u = sum(rank[v] for v in x) - n1 * (n1 + 1) / 2
    ties = sum(pooled.count(v) ** 3 - pooled.count(v) for v in set(pooled))
    sd = math.sqrt(n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))))
    z = (u - n1 * n2 / 2 - 0.5) / sd
    return u, 0.5 * math.erfc(z / math.sqrt(2))


CASES = [([0, 1, 2], [2, 1, 0]), ([3, 9, 4, 0, 1], [5, 8, 2, 1, 0]), ([1, 0, 7, 2], [4, 4, 4, 4])]


@pytest.mark.parametrize(("canary", "baseline"), CASES)
def test_u_against_ranks_of_the_expanded_values(canary: list[int], baseline: list[int]) -> None:
    u, p = rank_reference(canary, baseline)
    test = u_test(canary, baseline)
    assert test.u == pytest.approx(u) and test.p_value == pytest.approx(p)


@pytest.mark.parametrize(("canary", "baseline"), CASES)
def test_u_against_scipy(canary: list[int], baseline: list[int]) -> None:
    stats = pytest.importorskip("scipy.stats")
    ref = stats.mannwhitneyu(expanded(canary), expanded(baseline), alternative="greater",
                             method="asymptotic", use_continuity=True)  # fmt: skip
    test = u_test(canary, baseline)
    assert test.u == pytest.approx(ref.statistic) and test.p_value == pytest.approx(ref.pvalue)


def test_the_cli_exits_by_its_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "ruleloop.toml"
    config.write_text(
        '[targets.prod]\nvllm_url = "http://10.0.0.5:8000"\n'
        f'replicas = ["{BASELINE[0]}", "{BASELINE[1]}"]\ncanary_replicas = ["{CANARY}"]\n'
    )
    outcomes = {"keep": 0, "roll back": 1, "cannot judge": 2}
    for decision, code in outcomes.items():

        async def scripted(
            name: str, target: Target, ctx: object, decision: str = decision, **_: object
        ) -> LiveVerdict:
            assert name == "prod" and target.canary_replicas == [CANARY]
            return LiveVerdict(decision, "scripted")  # type: ignore[arg-type]

        monkeypatch.setattr(live, "analyse", scripted)
        result = CliRunner().invoke(
            cli, ["canary-live", "--target", "prod", "--minutes", "1", "--config", str(config)]
        )
        assert result.exit_code == code, result.output
        assert f"live canary: {decision.upper()}: scripted" in result.output
    unknown = CliRunner().invoke(cli, ["canary-live", "--target", "nope", "--minutes", "1",
                                       "--config", str(config)])  # fmt: skip
    assert unknown.exit_code == 2 and "unknown target" in unknown.output
