"""A CPU quota for the local engine's processes: a machine 10-30x slower than this one, on demand.

vLLM on a CPU without AVX-512 runs 10-30x slower than on one with it, and a demo or a test that
holds on a fast machine only proves nothing about a user's laptop. A cgroup's CFS quota makes
the engine slow the same way on any Linux machine: ``cores`` of CPU time per period for all its
processes together (0.25 = a quarter of one core). cgroup v1 (``cpu.cfs_quota_us``) and v2
(``cpu.max``) are both supported.

The quota bites once the engine serves: every process of its session (the API server, vLLM's
engine core) is moved in then. Serving is what AVX-512 speeds up 10-30x; a start is mostly Python
imports, which a 2-core AVX2 machine runs about half as fast as this one (51 s there, 25 s
here), where a tenth of one core would take 3-4 minutes.

``RULELOOP_ENGINE_CPU_LIMIT=0.1`` is the one switch that puts every engine this package starts
(``ruleloop engine up``, the demo, the local actuator, the test suite's engines) under that
quota: at 0.1 core an AVX-512 machine serves vLLM about as fast as a 2-core AVX2 one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bot.kernel import EngineError

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
ENV_VAR = "RULELOOP_ENGINE_CPU_LIMIT"
MIN_CORES, MAX_CORES = 0.01, 1024.0


def cores_from_environment(environ: Mapping[str, str] = os.environ) -> float | None:
    """The cores ``RULELOOP_ENGINE_CPU_LIMIT`` asks for (None when unset or empty)."""
    raw = environ.get(ENV_VAR, "").strip()
    if not raw:
        return None
    try:
        cores = float(raw)
    except ValueError:
        cores = float("nan")
    if not MIN_CORES <= cores <= MAX_CORES:  # NaN fails this too
        raise EngineError(
            f"{ENV_VAR}={raw!r} is not a number of cores from {MIN_CORES:g} to {MAX_CORES:g}: "
            f"set it to e.g. 0.1 (a tenth of one core), or unset it for no limit"
        )
    return cores


@dataclass(frozen=True)
class CpuLimit:
    """``cores`` of CPU time for the processes put in the group ``name``, granted per
    ``period_us`` (a shorter period: shorter stalls once the quota is spent, the same speed)."""

    cores: float
    name: str
    root: Path = CGROUP_ROOT
    period_us: int = PERIOD_US

    def __post_init__(self) -> None:
        if not MIN_CORES <= self.cores <= MAX_CORES:
            raise EngineError(
                f"a CPU limit is {MIN_CORES:g} to {MAX_CORES:g} cores, not {self.cores:g}"
            )

    @property
    def group(self) -> Path:
        """The cgroup's directory (v1: under the cpu controller; v2: the unified tree)."""
        v1 = self.root / "cpu"
        return (v1 if (v1 / "cgroup.procs").exists() else self.root) / self.name

    def apply(self, *pids: int) -> None:
        """Create the group with its quota and move each of ``pids`` (all its threads) in."""
        group = self.group
        quota = round(self.cores * self.period_us)
        try:
            group.mkdir(exist_ok=True)
            if (group / "cpu.cfs_quota_us").exists():
                (group / "cpu.cfs_quota_us").write_text("-1")  # a period never under the quota
                (group / "cpu.cfs_period_us").write_text(str(self.period_us))
                (group / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                (group / "cpu.max").write_text(f"{quota} {self.period_us}")
            for pid in pids:  # one pid per write: cgroup.procs takes one at a time
                (group / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            raise EngineError(
                f"cannot limit the engine to {self.cores:g} cores: {exc} (a CPU limit needs a "
                f"writable cgroup cpu controller under {self.root}: run as root, or without the "
                "limit)"
            ) from exc

    def remove(self, *, wait_s: float = 5.0) -> None:
        """Remove the group once its processes are gone: a process just killed leaves it a
        moment later, so this waits up to ``wait_s``; a group still in use is left (no error)."""
        deadline = time.monotonic() + wait_s
        while self.group.exists():
            try:
                self.group.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.05)
