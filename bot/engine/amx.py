"""AMX that the CPU advertises but the operating system has not enabled (seen in VMs).

vLLM's CPU attention picks its AMX kernel for a bf16 model when torch says AMX tiles are there
(``torch.cpu._is_amx_tile_supported``), and torch reads CPUID. Linux lets a process use the
tiles only where the kernel supports their state (XTILEDATA, bit 18 of what
``arch_prctl(ARCH_GET_XCOMP_SUPP)`` answers); a VM that advertises AMX without it kills the
engine core on its first request: "Illegal instruction", then every request answers 500
"EngineCore encountered an issue".

On such a machine the engine's processes start with a ``sitecustomize`` (on ``PYTHONPATH``)
that makes torch's answer False, so vLLM runs the AVX-512 kernels it runs on a CPU without AMX.
Elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path

ARCH_GET_XCOMP_SUPP = 0x1022
XFEATURE_XTILEDATA = 18
SYS_ARCH_PRCTL = 158  # x86_64
GUARD = '''"""ruleloop: this machine advertises AMX, but its OS has not enabled the tiles'
state: vLLM must not pick its AMX kernels here (bot/engine/amx.py)."""
import torch.cpu

torch.cpu._is_amx_tile_supported = lambda: False
'''


def advertised(cpuinfo: str) -> bool:
    """The CPU's flags (``/proc/cpuinfo``) name AMX tiles."""
    return any(
        line.startswith("flags") and "amx_tile" in line.split() for line in cpuinfo.splitlines()
    )


def os_supported_features() -> int | None:
    """The extended-state features the kernel supports (a bit mask), None where it cannot say."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mask = ctypes.c_ulong(0)
        if libc.syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_SUPP, ctypes.byref(mask)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return mask.value


def tiles_unusable(cpuinfo: str, supported: int | None) -> bool:
    """AMX advertised, and the kernel's supported features known and without tile data."""
    return advertised(cpuinfo) and supported is not None and not supported >> XFEATURE_XTILEDATA & 1


def guard_dir(state_dir: Path) -> Path | None:
    """A directory holding the ``sitecustomize`` to put first on the engine's ``PYTHONPATH``
    where this machine's AMX is unusable; None where it is usable or absent."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    if not tiles_unusable(cpuinfo, os_supported_features()):
        return None
    where = state_dir / "amx-off"
    where.mkdir(parents=True, exist_ok=True)
    (where / "sitecustomize.py").write_text(GUARD, encoding="utf-8")
    return where
