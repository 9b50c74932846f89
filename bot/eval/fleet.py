"""A fleet for a scenario: N real engines behind a real nginx that round-robins between them.

nginx is Debian's (`make system-deps` installs nginx-light). It runs in the foreground on
loopback with its files in a temporary directory, and stops with the block that started it.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from bot.engine import free_port
from bot.kernel import UsageError

LISTEN_TIMEOUT_S = 30.0


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
            _listening(port, proc, log)
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + LISTEN_TIMEOUT_S
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None:
                said = log.read_text() if log.exists() else "no log"
                raise UsageError(f"nginx exited at start: {said[-500:]}") from None
            if time.monotonic() > deadline:
                raise UsageError(f"nginx did not listen in {LISTEN_TIMEOUT_S:g} s") from None
            time.sleep(0.1)
