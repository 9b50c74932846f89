"""Slowloris against `ruleloop serve` and `ruleloop gateway`, both real processes, at once.

    python bench/slowloris_bench.py [--connections 300] [--attack-s 60] [--after-s 15]

Each server gets ``--connections`` connections that send a request line and then one header
line every ``--line-every-s`` seconds, never the end of the head; a connection the server
closes is opened again at once, for ``--attack-s`` seconds (a sustained attack, not one wave).
Then the attack stops and the servers idle for ``--after-s``. Every second the servers'
resident memory (VmRSS) is sampled. Both run their default head limits (bot/kernel/runtime/heads.py:
64 KiB, 100 lines, 10 s).

Prints, per server: connections of the first wave still open just after the head timeout, the
longest any connection lived, how many were opened in all, and RSS before / peak / after (MB);
with the load average before and after (the box is shared). No timing assertions: figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bot.engine.process import free_port
from bot.kernel.runtime.heads import HeadLimits

ROOT = Path(__file__).resolve().parent.parent
HEAD_TIMEOUT_S = HeadLimits().timeout_s


@dataclass
class Target:
    """One server under attack and what was seen of it."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    opened: int = 0
    open_now: int = 0
    wave: int = 0  # the first wave: the first ``wave`` connections opened
    first_wave_live: int = 0
    longest_s: float = 0.0
    first_wave_open: int | None = None
    rss_mb: list[float] = field(default_factory=list)

    def rss(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as status:
            line = next(x for x in status if x.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024


def start(name: str, argv: list[str], env: dict[str, str], log: Path) -> Target:
    port = free_port()
    argv = [sys.executable, "-c", "from bot.app.cli import main; main()", *argv]
    argv = [a.replace("{port}", str(port)) for a in argv]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    return Target(name, proc, port)


def wait_ready(target: Target, path: str, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"http://127.0.0.1:{target.port}{path}", timeout=2).status_code < 500:
                return
        if target.proc.poll() is not None:
            break
        time.sleep(0.3)
    raise SystemExit(f"{target.name} did not start:\n{log.read_text()[-2000:]}")


def servers(tmp: Path) -> list[Target]:
    """`ruleloop serve` (SQLite, console transport) and `ruleloop gateway` (its upstream a
    port nobody listens on: a slowloris never gets past the head)."""
    config = tmp / "ruleloop.toml"
    config.write_text('[slack]\nchannel = "#incidents"\n')
    env = {**os.environ, "RULELOOP_CONFIG": str(config),
           "RULELOOP_DATABASE_URL": f"sqlite:///{tmp / 'bot.db'}"}  # fmt: skip
    for name in ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_APP_TOKEN"):
        env.pop(name, None)
    serve = start("serve", ["serve", "--port", "{port}", "--state-dir", str(tmp / "state")],
                  env, tmp / "serve.log")  # fmt: skip
    upstream = f"http://127.0.0.1:{free_port()}"
    gateway = start("gateway", ["gateway", "--upstream", upstream, "--listen",
                                "127.0.0.1:{port}"], env, tmp / "gateway.log")  # fmt: skip
    wait_ready(serve, "/livez", tmp / "serve.log")
    wait_ready(gateway, "/metrics", tmp / "gateway.log")
    return [serve, gateway]


async def loris(target: Target, until: float, every_s: float) -> None:
    """Connections to ``target``, one after another until ``until``: each a head that never ends."""
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", target.port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        target.opened += 1
        target.open_now += 1
        first = target.opened <= target.wave
        target.first_wave_live += first
        opened = time.monotonic()
        with contextlib.suppress(OSError):
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
            line = 0
            while time.monotonic() < until:
                with contextlib.suppress(TimeoutError):
                    # the server's answer (408) or its close ends the connection
                    if await asyncio.wait_for(reader.read(4096), every_s) == b"":
                        break
                    continue
                writer.write(b"X-Loris-%d: a\r\n" % line)
                await writer.drain()
                line += 1
        target.open_now -= 1
        target.first_wave_live -= first
        target.longest_s = max(target.longest_s, time.monotonic() - opened)
        writer.close()


async def attack(targets: list[Target], args: argparse.Namespace) -> float:
    """The attack and the quiet after it, sampling RSS every second; the attack's start."""
    started = time.monotonic()
    until = started + args.attack_s
    for t in targets:
        t.wave = args.connections
    tasks = [asyncio.create_task(loris(t, until, args.line_every_s))
             for t in targets for _ in range(args.connections)]  # fmt: skip
    while time.monotonic() < until + args.after_s:
        await asyncio.sleep(1)
        for t in targets:
            t.rss_mb.append(t.rss())
            if t.first_wave_open is None and time.monotonic() > started + HEAD_TIMEOUT_S + 2:
                t.first_wave_open = t.first_wave_live
    await asyncio.gather(*tasks)
    return started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--connections", type=int, default=300, help="per server")
    parser.add_argument("--attack-s", type=float, default=60)
    parser.add_argument("--after-s", type=float, default=15)
    parser.add_argument("--line-every-s", type=float, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        targets = servers(Path(tmp))
        try:
            time.sleep(2)
            before = {t.name: t.rss() for t in targets}
            asyncio.run(attack(targets, args))
        finally:
            for t in targets:
                t.proc.terminate()
                t.proc.wait(timeout=60)
    for t in targets:
        print(json.dumps({
            "server": t.name, "connections": args.connections,
            "head_timeout_s": HEAD_TIMEOUT_S,
            "first_wave_open_after_timeout": t.first_wave_open,
            "longest_connection_s": round(t.longest_s, 1), "opened_in_all": t.opened,
            "rss_before_mb": round(before[t.name], 1), "rss_peak_mb": round(max(t.rss_mb), 1),
            "rss_after_mb": round(t.rss_mb[-1], 1),
        }))  # fmt: skip
    print(json.dumps({"load_average_before": load_before, "load_average_after": os.getloadavg(),
                      "cpus": os.cpu_count()}))  # fmt: skip


if __name__ == "__main__":
    main()
