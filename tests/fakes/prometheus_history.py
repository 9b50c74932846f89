"""A real Prometheus holding history written in advance (``promtool tsdb create-blocks-from``).

A test writes what the engine's metrics did over the last half hour as OpenMetrics samples;
promtool turns them into TSDB blocks and a real Prometheus serves them, so range queries are
answered by Prometheus itself (``rate``, ``histogram_quantile``) at times the test chose.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from bot.engine.process import free_port
from tests.alertmanager_process import ready

Sample = tuple[float, float]  # (unix seconds, value)


def openmetrics(series: Mapping[tuple[str, tuple[tuple[str, str], ...]], Sequence[Sample]]) -> str:
    """OpenMetrics text of ``{(name, labels): samples}``, one family per name (type unknown)."""
    lines: list[str] = []
    for name in sorted({n for n, _ in series}):
        lines.append(f"# TYPE {name} unknown")
        for (family, labels), samples in series.items():
            if family != name:
                continue
            text = ",".join(f'{k}="{v}"' for k, v in labels)
            lines += [f"{name}{{{text}}} {v!r} {t:.3f}" for t, v in samples]
    return "\n".join([*lines, "# EOF"]) + "\n"


@contextmanager
def prometheus_with(history: str, workdir: Path) -> Iterator[str]:
    """Start Prometheus on blocks made from ``history`` (OpenMetrics); yields its base URL."""
    data = workdir / "tsdb"
    data.mkdir(parents=True)
    source = workdir / "history.om"
    source.write_text(history)
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    config = workdir / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1m}\nscrape_configs: []\n")
    port = free_port()
    log = (workdir / "prometheus.log").open("w")
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=3650d"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not ready(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"Prometheus not ready:\n{(workdir / 'prometheus.log').read_text()[-3000:]}"
                )
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
