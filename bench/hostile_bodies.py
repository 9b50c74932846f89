"""Memory of a real `ruleloop serve` under 16 hostile 1 MiB webhook bodies at once.

Each kind of body is sent 16 times concurrently to /alertmanager (with the token), and the
server's resident memory (VmRSS, sampled every 5 ms from /proc) is read before and at its peak.
The kinds are the shapes a flood or an attacker sends: a flat array of a million numbers where
alerts should be, nesting far past the limit, 10,000 alerts of a thousand labels' worth, one
label value of a megabyte, and a body that is not JSON. The goal (issue 45): at most +50 MB.

    python bench/hostile_bodies.py            # prints one row per kind, and the worst
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile

import httpx
from _served_bot import TOKEN, rss_kib, served

MIB = 1 << 20
AT_ONCE = 16


SIZE = MIB - 4096  # just under `[server] max_body_bytes` (1 MiB): read whole, then refused


def bodies() -> dict[str, bytes]:
    """Just under a MiB of each hostile kind."""
    flat = b'{"version":"4","status":"firing","alerts":[' + b"1," * (SIZE // 2 - 40) + b"1]}"
    deep = b'{"alerts":' + b"[" * (SIZE // 2 - 8) + b"]" * (SIZE // 2 - 8) + b"}"
    labels = {f"l{i}": "v" * 40 for i in range(20)}
    alert = {"status": "firing", "labels": labels, "annotations": {}, "fingerprint": "f"}
    head = {"version": "4", "status": "firing", "groupKey": "g"}
    count = SIZE // (len(json.dumps(alert)) + 2)
    many = json.dumps(head | {"alerts": [alert] * count}).encode()
    long_label = json.dumps(head | {"alerts": [{"labels": {"x": "y" * (SIZE - 200)}}]}).encode()
    junk = os.urandom(SIZE)
    return {"flat array": flat, "deep nesting": deep, "many labels": many,
            "one long label": long_label, "not JSON": junk}  # fmt: skip


async def flood(url: str, body: bytes, pid: int) -> tuple[list[int], int]:
    """Statuses of AT_ONCE concurrent posts of ``body``, and the peak RSS (KiB) meanwhile."""
    peak, done = 0, False

    async def sample() -> None:
        nonlocal peak
        while not done:
            peak = max(peak, rss_kib(pid))
            await asyncio.sleep(0.005)

    sampler = asyncio.create_task(sample())
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=120) as client:
        answers = await asyncio.gather(
            *(client.post(f"{url}/alertmanager", content=body, headers=headers)
              for _ in range(AT_ONCE)),
            return_exceptions=True,
        )  # fmt: skip
    done = True
    await sampler
    statuses = [a.status_code if isinstance(a, httpx.Response) else -1 for a in answers]
    return statuses, peak


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, served(tmp, base_port=18000) as (proc, url):
        rows = []
        for name, body in bodies().items():
            before = statistics.median(rss_kib(proc.pid) for _ in range(5))
            statuses, peak = asyncio.run(flood(url, body, proc.pid))
            rows.append((name, len(body), statuses, before, peak))
            print(f"{name:<16} {len(body) / MIB:5.2f} MiB x{AT_ONCE}: statuses "
                  f"{sorted(set(statuses))}, RSS {before / 1024:.0f} -> peak "
                  f"{peak / 1024:.0f} MiB (+{(peak - before) / 1024:.1f} MiB)")  # fmt: skip
        worst = max(rows, key=lambda r: r[4] - r[3])
        print(f"worst: {worst[0]}, +{(worst[4] - worst[3]) / 1024:.1f} MiB (goal: <= +50 MB)")


if __name__ == "__main__":
    main()
