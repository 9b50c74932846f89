"""A fleet's diagnosis through the whole bot: /diagnose on a target of two replicas whose /metrics
pages are hand-made (one with a slow TTFT), the thread in the fake Slack, the summary in the
store, the incident page. One slow replica: the finding names it with its numbers, the thread's
line is short, and the ADR whose conditions the fleet's merged numbers meet is not offered;
what to do by hand is. Every replica alike: no replica finding, and the ADR is offered."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from tests import store_reads
from tests.fakes.bot import harness
from tests.fakes.slack_api import FakeSlack

EDGES = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
FAST = {0.02: 10, 0.04: 28, 0.06: 2}  # TTFT observations per bucket, per scrape interval
SLOW = {0.25: 5, 0.5: 35}
TPOT = {0.01: 30, 0.025: 10}
REPLICAS = ("http://10.0.0.7:8000", "http://10.0.0.8:8000")
WEB = {"link_secret": "fleet-page-test-secret-0123456789abcdef", "public_url": "https://rl.example"}


def histogram(name: str, observations: Mapping[float, int], times: int) -> list[str]:
    lines, running = [f"# TYPE {name} histogram"], 0
    for edge in sorted({*EDGES, *observations}):
        running += observations.get(edge, 0) * times
        lines.append(f'{name}_bucket{{engine="0",le="{edge}"}} {running}')
    lines += [f'{name}_bucket{{engine="0",le="+Inf"}} {running}',
              f'{name}_count{{engine="0"}} {running}', f'{name}_sum{{engine="0"}} {running * 0.1}']  # fmt: skip
    return lines


def page(
    ttft: Mapping[float, int],
    *,
    started: float,
    scrape: int,
    tpot: Mapping[float, int] = TPOT,
) -> str:
    """A replica's page after ``scrape`` intervals of the same traffic (its TTFT observations'
    count of requests finished each interval: 40 for FAST and SLOW)."""
    done = sum(ttft.values()) * scrape
    lines = [
        "# TYPE process_start_time_seconds gauge", f"process_start_time_seconds {started}",
        "# TYPE vllm:generation_tokens counter",
        f'vllm:generation_tokens_total{{engine="0"}} {16 * done}',
        "# TYPE vllm:generation_tokens_created gauge",
        f'vllm:generation_tokens_created{{engine="0"}} {started + 5}',
        "# TYPE vllm:request_success counter", f'vllm:request_success_total{{engine="0"}} {done}',
        "# TYPE vllm:num_requests_running gauge", 'vllm:num_requests_running{engine="0"} 2',
        "# TYPE vllm:num_requests_waiting gauge", 'vllm:num_requests_waiting{engine="0"} 0',
        "# TYPE vllm:kv_cache_usage_perc gauge", 'vllm:kv_cache_usage_perc{engine="0"} 0.1',
        *histogram("vllm:time_to_first_token_seconds", ttft, scrape),
        *histogram("vllm:request_time_per_output_token_seconds", tpot, scrape),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def fleet_transport(ttfts: Mapping[str, Mapping[float, int]]) -> httpx.MockTransport:
    """Each replica's /metrics, one more interval of traffic at each scrape."""
    scrapes = dict.fromkeys(ttfts, 0)

    def handler(request: httpx.Request) -> httpx.Response:
        host = f"{request.url.host}:{request.url.port}"
        if request.url.path != "/metrics" or host not in ttfts:
            return httpx.Response(404)
        scrapes[host] += 1
        started = 1000.0 + list(ttfts).index(host)  # two processes: two engines
        return httpx.Response(200, text=page(ttfts[host], started=started, scrape=scrapes[host]))

    return httpx.MockTransport(handler)


async def diagnose(
    tmp_path: Path, slack: FakeSlack, seven: Mapping[float, int]
) -> tuple[Any, Any, Any, str, dict[str, Any]]:
    h = harness(
        tmp_path, slack=slack, matching_adr=True, web=WEB,
        transport=fleet_transport({"10.0.0.7:8000": seven, "10.0.0.8:8000": FAST}),
        targets={"prod-a": {"vllm_url": "http://10.0.0.5:8000", "replicas": list(REPLICAS),
                            "actuator": {"kind": "dry-run"}}},
    )  # fmt: skip
    try:
        assert (await h.slash("prod-a")).status_code == 200
        await slack.until("chat.update")
        await h.bot.tasks.drain()
        root_update = slack.of("chat.update")[-1]
        _, findings, adrs = slack.of("chat.postMessage")
        link = re.search(r"<(https://rl\.example[^|>]+)\|incident page>",
                         json.dumps(root_update.args["blocks"]))  # fmt: skip
        assert link, root_update.args["blocks"]
        url = link[1].replace("&amp;", "&").removeprefix("https://rl.example")
        html = (await h.client.get(url)).text
        with h.bot.db.transaction() as s:
            (incident,) = store_reads.incidents(s)
            summary = incident.summary.json_dict()
        return root_update, findings, adrs, html, summary
    finally:
        await h.close()


async def test_one_slow_replica_is_named_and_no_fleet_wide_fix_is_offered(
    tmp_path: Path, slack: FakeSlack
) -> None:
    root, findings, adrs, html, summary = await diagnose(tmp_path, slack, SLOW)
    shown = json.dumps(findings.args["blocks"], ensure_ascii=False)
    assert (
        "one replica of 2 is slow: 10.0.0.7:8000 TTFT p99 497 ms vs 56.0 ms on the other 1"
    ) in shown
    line = "replicas: 10.0.0.7:8000 TTFT p99 497 ms (slow) · 1 other ≤ 56.0 ms"
    assert line in shown and line in json.dumps(root.args["blocks"], ensure_ascii=False)
    # the ADR the fleet's merged numbers match is held back; what to do by hand instead
    assert "apply_adr" not in json.dumps(adrs.args["blocks"])
    assert adrs.args["text"].startswith("Not offered: ADR-20260831-01")
    assert "By hand: drain or restart 10.0.0.7:8000" in adrs.args["text"]
    assert summary["matches"] == [] and summary["withheld_matches"] == ["ADR-20260831-01"]
    fleet = summary["replicas"]
    assert fleet["kind"] == "outlier" and fleet["slow"] == ["10.0.0.7:8000"]
    assert [r["requests"] for r in fleet["rows"]] == [80, 80]
    # the incident page: the line, the by-hand advice and the table, slow replica first
    assert line in html and "drain or restart 10.0.0.7:8000" in html
    rows = re.findall(r'<tr data-replica="([^"]+)">.*?badge \w+">([^<]+)<', html, re.S)
    assert rows == [("10.0.0.7:8000", "slow"), ("10.0.0.8:8000", "ok")]
    assert "No accepted ADR matched" in html


async def test_replicas_alike_no_replica_finding_and_the_adr_is_offered(
    tmp_path: Path, slack: FakeSlack
) -> None:
    _, findings, adrs, html, summary = await diagnose(tmp_path, slack, FAST)
    shown = json.dumps(findings.args["blocks"], ensure_ascii=False)
    assert "is slow" not in shown and "none stands out" in shown
    assert adrs.args["blocks"][1]["accessory"]["action_id"] == "apply_adr"
    assert summary["matches"] == ["ADR-20260831-01"] and summary["withheld_matches"] == []
    assert summary["replicas"]["kind"] == "alike"
    assert 'id="replica-table"' in html
