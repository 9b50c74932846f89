"""Prefill/decode disaggregation at the wire: a target's replicas as two pools, from a fake
vllm-router's GET /workers (the shape the real vllm-router 0.1.17 answers with
``--vllm-pd-disaggregation``: prefill workers carry a ``bootstrap_port``) or from
``prefill_replicas`` / ``decode_replicas``; each engine's /metrics a recorded page served over
HTTP (tests/test_fleet_endpointslices.py's ``metrics``).

TTFT is read on the prefill pool, TPOT and the finished requests on the decode pool, and each
replica is judged against the others of its pool only. Every scenario here is built so that the
merged reading (one fleet of like engines) says otherwise: a prefill pool's one-token legs pull
the merged TPOT p99 down, a decode pool's TTFT (its own leg, not the user's) pulls the merged
TTFT p99 up and makes a decode replica look slow against the prefill ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from bot.diagnosis import replica_text
from bot.diagnosis import replicas as replica_rule
from bot.diagnosis.probes.context import TargetRef, resolve_replicas
from bot.diagnosis.probes.replicas import Replica, replicas_of, source_of
from bot.diagnosis.probes.types import ProbeResult
from bot.diagnosis.probes.vllm_window import VllmMetricsProbe, WindowParams
from bot.diagnosis.runbooks.runner import RunbookResult
from bot.kernel.config import Target
from bot.kernel.errors import ProbeError
from tests import store_reads
from tests.fakes.bot import harness
from tests.fakes.slack_api import FakeSlack
from tests.test_fleet_diagnosis import FAST, SLOW, WEB, page
from tests.test_fleet_endpointslices import metrics
from tests.test_fleet_router import FakeRouter, router, worker  # noqa: F401 (fixture)

P1, P2 = "10.2.0.7", "10.2.0.8"  # the prefill pool
D1, D2 = "10.2.1.7", "10.2.1.8"  # the decode pool
# 40 requests an interval on every replica. TPOT: a prefill replica's one-token legs, which
# vLLM times as 0; the decode pool's tail, 1 request in 80 past 80 ms: its p99 is 84 ms, but
# merged with as many zeros from the prefill legs the tail is under 1 % and the p99 ~25 ms.
ONE_TOKEN = {0.001: 40}
DECODING = {0.025: 39, 0.1: 1}
SMOOTH = {0.025: 40}
LATE = {1.0: 40}  # a decode replica's own TTFT: after the prefill pool's, and the KV transfer


def started_at(host: str) -> float:
    """Each engine's own start time (a restart would read as a new engine)."""
    return 1000.0 + int(host.rsplit(".", 1)[1]) + 10 * int(host.split(".")[2])


def served(engines: Mapping[str, tuple[Mapping[float, int], Mapping[float, int]]]) -> Any:
    """A probe context whose engines answer three scrapes each (a 2-s window, 1-s interval)."""
    return metrics({
        host: [page(ttft, tpot=tpot, started=started_at(host), scrape=k) for k in range(3)]
        for host, (ttft, tpot) in engines.items()
    })  # fmt: skip


async def read(target: Target, ctx: Any) -> tuple[ProbeResult, replica_rule.FleetVerdict]:
    """The vllm_metrics probe's result over the window, and the replica rule's verdict on it."""
    result = await VllmMetricsProbe().run(
        target=TargetRef("pd", target), params=WindowParams(window_s=2, interval_s=1), ctx=ctx
    )
    run = RunbookResult(
        runbook="fleet",
        details={"vllm_metrics": result.details},
        windows={"vllm_metrics": result.window},  # type: ignore[dict-item]
    )
    verdict = replica_rule.of_run(run)
    assert verdict is not None
    return result, verdict


def pd_workers() -> dict[str, Any]:
    """GET /workers of vllm-router 0.1.17 started with --vllm-pd-disaggregation --prefill P1
    9000 --prefill P2 --decode D1 --decode D2 (recorded from the real router)."""
    prefill = [{**worker(f"http://{h}:8000", kind="prefill"), "bootstrap_port": port}
               for h, port in ((P1, 9000), (P2, None))]  # fmt: skip
    decode = [worker(f"http://{h}:8001", kind="decode") for h in (D1, D2)]
    return {"workers": [*prefill, *decode], "total": 4,
            "stats": {"prefill_count": 2, "decode_count": 2, "regular_count": 0}}  # fmt: skip


async def test_the_routers_prefill_and_decode_workers_are_two_pools(
    router: tuple[FakeRouter, str],  # noqa: F811
) -> None:
    fake, url = router
    fake.body = pd_workers()
    fake.body["workers"].append(worker("http://10.2.1.9:8001", kind="decode", healthy=False))
    assert await resolve_replicas(Target(vllm_url=url, router_url=url)) == [
        Replica(f"http://{P1}:8000", pool="prefill"), Replica(f"http://{P2}:8000", pool="prefill"),
        Replica(f"http://{D1}:8001", pool="decode"), Replica(f"http://{D2}:8001", pool="decode"),
    ]  # fmt: skip


async def test_a_slow_prefill_replica_is_named_in_its_pool_and_ttft_read_on_that_pool(
    router: tuple[FakeRouter, str],  # noqa: F811
) -> None:
    fake, url = router
    fake.body = pd_workers()
    ctx = served({
        P1: (SLOW, ONE_TOKEN), P2: (FAST, ONE_TOKEN), D1: (LATE, DECODING), D2: (LATE, SMOOTH),
    })  # fmt: skip
    result, verdict = await read(Target(vllm_url=url, router_url=url), ctx)
    pools = result.details["pools"]
    assert pools["prefill"]["replicas"] == [f"{P1}:8000", f"{P2}:8000"]
    assert pools["decode"]["replicas"] == [f"{D1}:8001", f"{D2}:8001"]
    # TTFT is the prefill pool's (the merged p99 would be the decode legs' ~1 s); TPOT the
    # decode pool's (the prefill legs' one-token requests would pull it to ~25 ms)
    ttft, tpot = result.readings.value("ttft_p99_ms"), result.readings.value("tpot_p99_ms")
    assert ttft == pools["prefill"]["ttft_p99_ms"] and ttft is not None and 250 < ttft < 500
    assert tpot == pools["decode"]["tpot_p99_ms"] and tpot is not None and 80 < tpot < 100
    assert result.readings.value("requests_finished") == 2 * 40 * 2  # the decode pool's alone
    (said,) = [f.message for f in result.findings if f.message.startswith("prefill/decode")]
    assert "TTFT p99 49" in said and "from the prefill pool (2 replicas)" in said
    assert "from the decode pool (2 replicas)" in said
    # the slow prefill replica, against the other prefill replica only
    assert [r.address for r in verdict.slow] == [f"{P1}:8000"]
    (slow,) = verdict.slow
    assert [j.metric for j in slow.slow] == ["ttft_p99_ms"] and slow.slow[0].others == 1
    (finding, *_) = replica_text.findings(verdict, fleet_slow=True)
    assert finding.message.startswith(
        f"one replica of 2 in the prefill pool is slow: {P1}:8000 TTFT p99 49"
    )
    line = replica_text.line(verdict)
    assert line.startswith(f"replicas: prefill pool: {P1}:8000 TTFT p99 49")
    assert "; decode pool: worst " in line and "TPOT p99" in line.split("; decode pool:")[1]
    # a decode replica is not judged on its TTFT, nor a prefill one on its TPOT (these pages
    # have no queue-time histogram: nothing to judge there)
    judged = {r.address: set(r.judged) for r in verdict.rows}
    assert judged[f"{D1}:8001"] == judged[f"{D2}:8001"] == {"tpot_p99_ms"}
    assert judged[f"{P1}:8000"] == judged[f"{P2}:8000"] == {"ttft_p99_ms"}
    rows = replica_text.summary_json(verdict).model_dump()["rows"]
    assert {r["replica"]: r["pool"] for r in rows} == {
        f"{P1}:8000": "prefill", f"{P2}:8000": "prefill",
        f"{D1}:8001": "decode", f"{D2}:8001": "decode",
    }  # fmt: skip


def pd_target(**kwargs: Any) -> Target:
    return Target(
        vllm_url="http://10.2.9.9:8000",
        prefill_replicas=[f"http://{P1}:8000", f"http://{P2}:8000"],
        decode_replicas=[f"http://{D1}:8001", f"http://{D2}:8001"],
        **kwargs,
    )


async def test_a_decode_pools_ttft_does_not_drive_ttft_and_its_tpot_is_judged_on_it() -> None:
    target = pd_target()
    assert source_of(target) == "pools"
    assert [r.pool for r in replicas_of(target)] == ["prefill", "prefill", "decode", "decode"]
    # the prefill pool is fast; the decode pool has a TPOT tail, its replicas alike, and one
    # of them a late TTFT of its own leg (the merged rule would call it slow on TTFT)
    ctx = served({
        P1: (FAST, ONE_TOKEN), P2: (FAST, ONE_TOKEN), D1: (LATE, DECODING), D2: (FAST, SMOOTH),
    })  # fmt: skip
    result, verdict = await read(target, ctx)
    ttft, tpot = result.readings.value("ttft_p99_ms"), result.readings.value("tpot_p99_ms")
    assert ttft is not None and ttft < 60  # the prefill pool's; merged: the late leg's ~1 s
    assert tpot is not None and tpot > 80  # the decode pool's tail; merged: ~25 ms
    assert verdict.slow == [] and verdict.kind == "alike"
    assert "ttft_p99_ms" not in {m for r in verdict.rows if "10.2.1" in r.address
                                 for m in r.judged}  # fmt: skip
    assert "none stands out" in replica_text.line(verdict).split("; decode pool:")[1]


async def test_a_silent_decode_pool_is_not_measured_never_read_as_the_prefill_pool() -> None:
    ctx = metrics({  # the decode engines refuse every connection
        **{h: [page(FAST, tpot=ONE_TOKEN, started=started_at(h), scrape=k) for k in range(3)] for h in (P1, P2)},
        D1: [None], D2: [None],
    })  # fmt: skip
    result = await VllmMetricsProbe().run(
        target=TargetRef("pd", pd_target()), params=WindowParams(window_s=2, interval_s=1), ctx=ctx
    )
    assert result.readings.value("ttft_p99_ms") == pytest.approx(56.0)  # the prefill pool's
    # merged, the prefill pool's one-token legs would be the TPOT (1 ms) and its 160 requests
    assert result.readings.value("tpot_p99_ms") is None
    assert result.readings.value("requests_finished") is None
    assert "TPOT p99 n/a from the decode pool (2 replicas)" in result.findings[0].message
    assert "answered 0 of 3 scrapes" in result.details["replicas"][f"{D1}:8001"]["note"]


async def test_a_fleet_of_like_engines_has_no_pools() -> None:
    listed = Target(vllm_url="http://10.2.9.9:8000",
                    replicas=[f"http://{P1}:8000", f"http://{D1}:8001"])  # fmt: skip
    assert source_of(listed) == "replicas" and {r.pool for r in replicas_of(listed)} == {None}
    result, verdict = await read(listed, served({P1: (FAST, ONE_TOKEN), D1: (LATE, DECODING)}))
    assert "pools" not in result.details and verdict.pools == {}
    assert not [f for f in result.findings if f.message.startswith("prefill/decode")]


@pytest.mark.parametrize(
    ("workers", "error"),
    [
        (
            [worker("http://10.2.0.7:8000", kind="prefill")],
            r"routes to prefill workers \(prefill/decode disaggregation\) but to no healthy "
            "decode worker: its decode pool serves nothing now",
        ),
        (
            [worker("http://10.2.0.7:8000", kind="prefill"),
             worker("http://10.2.1.7:8001", kind="decode", healthy=False)],
            r"no healthy decode worker \(1 unhealthy: http://10.2.1.7:8001\)",
        ),
        (
            [worker("http://10.2.1.7:8001", kind="decode")],
            "routes to decode workers .* but to no healthy prefill worker",
        ),
        (
            [worker("http://10.2.0.7:8000", kind="prefill"),
             worker("http://10.2.1.7:8001", kind="decode"), worker("http://10.2.2.7:8000")],
            "regular workers beside prefill/decode ones: .* list the pools in prefill_replicas",
        ),
        (
            [worker("http://10.2.0.7:8000", kind="prefill"),
             worker("http://10.2.0.7:8000", kind="decode")],
            "lists http://10.2.0.7:8000 as a prefill worker and as a decode one: an engine "
            "serves one pool",
        ),
        ([worker("http://10.2.0.7:8000", kind="encode")], "a worker of type 'encode'"),
    ],
)  # fmt: skip
async def test_workers_that_are_not_two_pools_are_an_error(
    router: tuple[FakeRouter, str],  # noqa: F811
    workers: list[dict[str, Any]],
    error: str,
) -> None:
    fake, url = router
    fake.body = {"workers": workers}
    with pytest.raises(ProbeError, match=error):
        await resolve_replicas(Target(vllm_url=url, router_url=url))


@pytest.mark.parametrize(
    ("pools", "error"),
    [
        (
            {"prefill_replicas": ["http://10.2.0.7:8000"]},
            "prefill_replicas is set but decode_replicas is empty: a prefill/decode target has "
            "both pools; list that pool's engines in decode_replicas",
        ),
        (
            {"decode_replicas": ["http://10.2.1.7:8000"]},
            "decode_replicas is set but prefill_replicas is empty",
        ),
        (
            {"prefill_replicas": ["http://10.2.0.7:8000", "http://10.2.0.8:8000"],
             "decode_replicas": ["http://10.2.0.8:8000/"]},
            "10.2.0.8:8000 is in both prefill_replicas and decode_replicas: an engine serves "
            "one pool .* list it in its own pool only",
        ),
        (
            {"prefill_replicas": ["http://10.2.0.7:8000"],
             "decode_replicas": ["http://10.2.1.7:8000"], "replicas": ["http://10.2.2.7:8000"]},
            "replicas and prefill_replicas/decode_replicas both name the target's engines",
        ),
        (
            {"prefill_replicas": ["http://10.2.0.7:8000", "http://10.2.0.7:8000"],
             "decode_replicas": ["http://10.2.1.7:8000"]},
            "a prefill replica is listed twice",
        ),
        (
            {"prefill_replicas": ["10.2.0.7:8000"], "decode_replicas": ["http://10.2.1.7:8000"]},
            "is not an http.s. URL",
        ),
        (
            {"prefill_replicas": ["http://10.2.0.7:8000"],
             "decode_replicas": ["http://10.2.1.7:8000"],
             "canary_replicas": ["http://10.2.1.7:8000"]},
            "10.2.1.7:8000 is both a canary replica and a baseline one",
        ),
    ],
)  # fmt: skip
def test_pools_the_configuration_refuses_say_what_to_fix(pools: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        Target(vllm_url="http://10.2.9.9:8000", **pools)


def pd_transport(
    engines: Mapping[str, tuple[Mapping[float, int], Mapping[float, int]]],
) -> httpx.MockTransport:
    """Each replica's /metrics (by host), one more interval of traffic at each scrape."""
    scrapes: dict[str, int] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        host = str(request.url.host)
        if request.url.path != "/metrics" or host not in engines:
            return httpx.Response(404)
        scrapes[host] = scrapes.get(host, -1) + 1
        ttft, tpot = engines[host]
        return httpx.Response(
            200, text=page(ttft, tpot=tpot, started=started_at(host), scrape=scrapes[host])
        )

    return httpx.MockTransport(handler)


async def test_the_thread_says_which_pool_each_number_and_verdict_comes_from(
    tmp_path: Path, slack: FakeSlack
) -> None:
    engines = {P1: (SLOW, ONE_TOKEN), P2: (FAST, ONE_TOKEN),
               D1: (LATE, DECODING), D2: (LATE, SMOOTH)}  # fmt: skip
    pd = {"vllm_url": "http://10.2.9.9:8000", "actuator": {"kind": "dry-run"},
          "prefill_replicas": [f"http://{P1}:8000", f"http://{P2}:8000"],
          "decode_replicas": [f"http://{D1}:8001", f"http://{D2}:8001"]}  # fmt: skip
    h = harness(tmp_path, slack=slack, transport=pd_transport(engines), targets={"pd": pd},
                web=WEB)  # fmt: skip
    try:
        assert (await h.slash("pd")).status_code == 200
        await slack.until("chat.update")
        await h.bot.tasks.drain()
        root = json.dumps(slack.of("chat.update")[-1].args["blocks"], ensure_ascii=False)
        thread = json.dumps([m.args for m in slack.of("chat.postMessage")], ensure_ascii=False)
        link = re.search(r"<https://rl\.example([^|>]+)\|incident page>", root)
        assert link, root
        html = (await h.client.get(link[1].replace("&amp;", "&"))).text
        with h.bot.db.transaction() as s:
            (incident,) = store_reads.incidents(s)
            summary = incident.summary.json_dict()
    finally:
        await h.close()
    assert "prefill/decode pools: TTFT p99 49" in thread
    assert "from the prefill pool (2 replicas); TPOT p99 84.0 ms from the decode pool" in thread
    assert f"one replica of 2 in the prefill pool is slow: {P1}:8000 TTFT p99 49" in thread
    line = f"replicas: prefill pool: {P1}:8000 TTFT p99 49"
    assert line in root and "; decode pool: worst" in root
    assert summary["headline"]["ttft_p99_ms"] < 500  # the prefill pool's, not the merged ~1 s
    assert line in html  # the incident page: the line, and each row's pool
    rows = re.findall(r'<tr data-replica="([^"]+)">.*?badge \w+">([^<]+)<.*?</tr>', html, re.S)
    assert rows[0] == (f"{P1}:8000", "slow")
    (p1_row,) = re.findall(rf'<tr data-replica="{P1}:8000">.*?</tr>', html, re.S)
    (d1_row,) = re.findall(rf'<tr data-replica="{D1}:8001">.*?</tr>', html, re.S)
    assert "prefill pool" in p1_row and "decode pool" in d1_row
    fleet = summary["replicas"]
    assert fleet["slow"] == [f"{P1}:8000"]
    assert {r["replica"]: r.get("pool") for r in fleet["rows"]} == {
        f"{P1}:8000": "prefill", f"{P2}:8000": "prefill",
        f"{D1}:8001": "decode", f"{D2}:8001": "decode",
    }  # fmt: skip
