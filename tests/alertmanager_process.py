"""A real Alertmanager (Debian's prometheus-alertmanager) for a test: started on a free port
with the given config, ready before it is used, stopped after."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bot.engine.process import free_port


@contextlib.contextmanager
def alertmanager(tmp_path: Path, config: dict[str, Any]) -> Iterator[str]:
    """Alertmanager with ``config`` (its YAML as a dict); its base URL."""
    binary = shutil.which("prometheus-alertmanager")
    if binary is None:
        pytest.skip("Alertmanager is not installed (`make test` installs prometheus-alertmanager)")
    (tmp_path / "am.yml").write_text(yaml.safe_dump(config))
    port, log_path = free_port(), tmp_path / "am.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am'}",
             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            wait(lambda: ready(url), what="Alertmanager ready", log=log_path)
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def ready(url: str) -> bool:
    """Whether a Prometheus or Alertmanager at ``url`` says it is ready."""
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def wait(done: Callable[[], bool], *, what: str, log: Path, timeout: float = 30) -> None:
    """Poll ``done`` until it holds; fail with the process's log after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what}: timed out\n{log.read_text()[-2000:]}"
        time.sleep(0.2)


def kube_alert(n: int, instance: str = "10.0.0.5:8000") -> dict[str, object]:
    """An alert as kube-prometheus labels it: about 930 bytes in the webhook."""
    pod = f"vllm-llama-3-8b-instruct-7d9f8c6b5-{n:05d}"
    return {
        "labels": {
            "alertname": "VLLMTimeToFirstTokenP99High", "instance": instance,
            "container": "vllm", "endpoint": "http-metrics", "job": "vllm-llama-3-8b-instruct",
            "namespace": "inference", "pod": pod, "service": "vllm-llama-3-8b-instruct",
            "prometheus": "monitoring/kube-prometheus-stack-prometheus", "severity": "page",
            "model_name": "meta-llama/Meta-Llama-3-8B-Instruct", "node": f"gpu-node-{n % 64:03d}",
        },
        "annotations": {
            "summary": "vLLM time to first token p99 is above its line",
            "description": f"TTFT p99 of {pod} has been 2.4 s for 5 minutes (line: 1 s).",
            "runbook_url": "https://runbooks.example.com/vllm/VLLMTimeToFirstTokenP99High",
        },
        "generatorURL": "http://prometheus-k8s.monitoring.svc:9090/graph?g0.expr=histogram_quantile",
    }  # fmt: skip
