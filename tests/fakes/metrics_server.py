"""A real HTTP server that replays recorded vLLM /metrics pages (before, during, after, ...)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class RecordedMetrics:
    """``with RecordedMetrics(pages) as engine:`` serves ``engine.base_url + '/metrics'``."""

    def __init__(self, pages: Sequence[str]) -> None:
        self.pages = list(pages)
        self.scrapes = 0
        lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                with lock:
                    page = owner.pages[owner.scrapes % len(owner.pages)]
                    owner.scrapes += 1
                data = page.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT"""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> RecordedMetrics:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
