"""The fake Kubernetes API (``tests.fakes.kube_api``) over real HTTP, for bots in other processes.

``with KubeServer(fake) as api:`` serves ``api.url``; every request goes through the fake's own
``handle`` (one at a time: the fake is not thread-safe), so what a ``ruleloop serve`` process
sees is what the in-process tests see. Code in the test that changes the fake while the server
runs (a GitOps controller) holds ``api.lock`` meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from bot.kernel.config import KubernetesApiSpec
from tests.fakes.kube_api import TOKEN, FakeKube


class KubeServer:
    """A threaded HTTP server in front of one ``FakeKube``."""

    def __init__(self, fake: FakeKube) -> None:
        self.fake = fake
        self.lock = lock = threading.RLock()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request = httpx.Request(
                    self.command,
                    f"http://kube.test{self.path}",
                    headers=dict(self.headers.items()),
                    content=self.rfile.read(length) if length else b"",
                )
                with lock:
                    response = fake.handle(request)
                body = response.content
                self.send_response(response.status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PATCH = _answer  # noqa: N815 (the names http.server calls)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """http://127.0.0.1:PORT"""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> KubeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def served_api(fake: FakeKube, tmp_path: Path) -> Iterator[KubernetesApiSpec]:
    """``fake`` over HTTP as a target's kubernetes_api: its URL and a token file it accepts."""
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    with KubeServer(fake) as server:
        yield KubernetesApiSpec(api_url=server.url, token_file=token, ca_file=None)
