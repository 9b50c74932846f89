"""What stands in front of a scenario's engines: nginx over a fleet, `ruleloop gateway`, a delay.

nginx is Debian's (`make system-deps` installs nginx-light): round-robin over N real engines, in
the foreground on loopback, its files in a temporary directory. The gateway is the real
`ruleloop gateway` in its own process. ``delayed`` holds each request before the engine gets it
(a slow hop between the gateway and the engine). Each stops with the block that started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import aiohttp
from aiohttp import web

from bot.engine import free_port
from bot.kernel import UsageError

LISTEN_TIMEOUT_S = 30.0
FORWARDED = {"content-type", "accept", "authorization"}  # request headers the delay forwards


def nginx_conf(tmp: Path, port: int, upstreams: Sequence[int]) -> str:
    """nginx's configuration: round-robin over the engines on ``upstreams`` (loopback ports),
    streaming answers unbuffered, on 127.0.0.1:``port``."""
    servers = "\n".join(f"    server 127.0.0.1:{p};" for p in upstreams)
    temp = "\n".join(
        f"  {kind}_temp_path {tmp}/{kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 256; }}
http {{
  access_log off;
{temp}
  upstream engines {{
{servers}
    keepalive 8;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://engines;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 600s;
    }}
  }}
}}
"""


@contextlib.contextmanager
def router(upstreams: Sequence[int], *, tmp: Path | None = None) -> Iterator[str]:
    """nginx round-robin over ``upstreams`` for as long as the block runs; its base URL."""
    binary = shutil.which("nginx") or shutil.which("/usr/sbin/nginx")
    if binary is None:
        raise UsageError("nginx is missing: a fleet scenario puts its engines behind nginx "
                         "(`make system-deps` installs Debian's nginx-light)")  # fmt: skip
    with contextlib.ExitStack() as stack:
        where = tmp or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nginx-")))
        port = free_port()
        conf = where / "nginx.conf"
        conf.write_text(nginx_conf(where, port, upstreams))
        log = where / "error.log"
        proc = subprocess.Popen([binary, "-p", str(where), "-c", str(conf), "-e", str(log)])
        try:
            _listening(port, proc, log, "nginx")
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _listening(port: int, proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    """Wait until ``proc`` (``what``) listens on ``port``; UsageError with its log's end when
    it exits first or does not listen in time."""
    deadline = time.monotonic() + LISTEN_TIMEOUT_S
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None:
                said = log.read_text(errors="replace") if log.exists() else "no log"
                raise UsageError(f"{what} exited at start: {said[-500:]}") from None
            if time.monotonic() > deadline:
                raise UsageError(f"{what} did not listen in {LISTEN_TIMEOUT_S:g} s") from None
            time.sleep(0.1)


@contextlib.asynccontextmanager
async def delayed(upstream: str, delay_s: float) -> AsyncIterator[str]:
    """A proxy on loopback that holds every request ``delay_s`` before it forwards it to
    ``upstream`` (streamed back unbuffered): latency in front of the engine, not in it."""
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def forward(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(delay_s)
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED}
        body = await request.read()
        url = upstream + request.path_qs
        async with session.request(request.method, url, data=body, headers=headers) as answer:
            kind = answer.headers.get("Content-Type", "application/json")
            response = web.StreamResponse(status=answer.status, headers={"Content-Type": kind})
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await session.close()


@contextlib.contextmanager
def gateway(upstream: str) -> Iterator[str]:
    """`ruleloop gateway` in front of ``upstream`` for as long as the block runs; its URL."""
    port = free_port()
    binary = Path(sys.executable).with_name("ruleloop")
    command = [str(binary) if binary.exists() else "ruleloop", "gateway", "--upstream", upstream,
               "--listen", f"127.0.0.1:{port}"]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gateway-") as where:
        log = Path(where) / "gateway.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            _listening(port, proc, log, "the gateway")
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=30)
