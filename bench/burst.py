"""A burst of 10,000 Alertmanager notifications at a real `ruleloop serve`: what it holds.

Each notification is its own group for no configured target, so each opens an incident whose
diagnosis fails at once ("no target") and owes Slack two messages (console transport here): the
most background work a notification can start. They are sent 32 at a time. Printed: the
server's resident memory (VmRSS, sampled every 20 ms) before, at its peak and after; the work
shed to the outbox job (`ruleloop_background_shed_total`); and how long until every incident was
diagnosed and no message was owed, with the outbox job at its default period (15 s).

    python bench/burst.py [COUNT]      # default 10,000
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _served_bot import TOKEN, rss_kib, served

AT_ONCE = 32


def body(i: int) -> bytes:
    labels = {"alertname": "VLLMTimeToFirstTokenP99High", "job": "vllm",
              "instance": f"10.9.{i // 250}.{i % 250}:8000"}  # fmt: skip
    alert = {"status": "firing", "labels": labels, "annotations": {},
             "startsAt": "2026-12-05T02:00:00Z", "fingerprint": f"{i:016x}"}  # fmt: skip
    return json.dumps({"version": "4", "status": "firing", "receiver": "ruleloop",
                       "groupKey": f'{{}}:{{instance="burst-{i}"}}', "groupLabels": {},
                       "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://am",
                       "alerts": [alert]}).encode()  # fmt: skip


async def send(url: str, count: int, pid: int) -> tuple[dict[int, int], int, float]:
    """Statuses by count, the peak RSS (KiB) and the seconds the burst took."""
    peak, done, statuses = 0, False, {}

    async def sample() -> None:
        nonlocal peak
        while not done:
            peak = max(peak, rss_kib(pid))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=120) as client:
        for first in range(0, count, AT_ONCE):
            answers = await asyncio.gather(
                *(client.post(f"{url}/alertmanager", content=body(i), headers=headers)
                  for i in range(first, min(count, first + AT_ONCE))),
                return_exceptions=True,
            )  # fmt: skip
            for a in answers:
                code = a.status_code if isinstance(a, httpx.Response) else -1
                statuses[code] = statuses.get(code, 0) + 1
    took = time.monotonic() - started
    done = True
    await sampler
    return statuses, peak, took


def owed(db: Path) -> tuple[int, int]:
    """(incidents not diagnosed yet, Slack messages still owed)."""
    with sqlite3.connect(db) as conn:
        undiagnosed = conn.execute("select count(*) from incidents where id not in (select "
                                   "incident_id from audit_log where action like 'diagnosis.%' "
                                   "and incident_id is not null)").fetchone()[0]  # fmt: skip
        pending = conn.execute(
            "select count(*) from outbox where state = 'pending' "
            "and kind in ('root', 'update', 'reply', 'chart')"
        ).fetchone()[0]
    return int(undiagnosed), int(pending)


def shed(url: str) -> str:
    lines = httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
    return ", ".join(line for line in lines if line.startswith("ruleloop_background_shed_total"))


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    with tempfile.TemporaryDirectory() as tmp, served(tmp, base_port=19000) as (proc, url):
        db = Path(tmp) / "ruleloop.db"
        before = rss_kib(proc.pid)
        statuses, peak, took = asyncio.run(send(url, count, proc.pid))
        print(f"{count} notifications in {took:.0f} s: statuses {statuses}")
        print(f"RSS {before / 1024:.0f} MiB -> peak {peak / 1024:.0f} MiB")
        print(f"at the end of the burst: {shed(url)}; owed (undiagnosed, messages): {owed(db)}")
        started = time.monotonic()
        while owed(db) != (0, 0) and time.monotonic() - started < 1800:
            time.sleep(5)
            print(
                f"  +{time.monotonic() - started:4.0f} s: owed {owed(db)}, "
                f"RSS {rss_kib(proc.pid) / 1024:.0f} MiB",
                flush=True,
            )
        print(
            f"drained in {time.monotonic() - started:.0f} s after the burst; "
            f"RSS {rss_kib(proc.pid) / 1024:.0f} MiB"
        )


if __name__ == "__main__":
    main()
