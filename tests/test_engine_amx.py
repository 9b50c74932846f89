"""AMX advertised by the CPU but not enabled by the OS (a VM): the engine's processes are told
so, and vLLM runs its AVX-512 kernels instead of dying on its first request (bot/engine/amx.py).
Found on an Intel Xeon (AMX) Firecracker guest, where every engine answered 500 after an
"Illegal instruction" in vLLM's AMX attention kernel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bot.engine.amx import XFEATURE_XTILEDATA, guard_dir, tiles_unusable
from bot.engine.process import engine_env

AMX_CPU = "processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n"
AMD_CPU = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
WITH_TILES = 0x602E7  # XTILECFG (17) and XTILEDATA (18) supported
WITHOUT_TILES = 0x202E7  # XTILECFG only: what the VM's kernel answered


@pytest.mark.parametrize(
    ("cpuinfo", "supported", "unusable"),
    [
        (AMX_CPU, WITHOUT_TILES, True),
        (AMX_CPU, WITH_TILES, False),
        (AMX_CPU, None, False),  # the kernel could not say: leave vLLM as it is
        (AMD_CPU, WITHOUT_TILES, False),
        ("flags\t\t: fpu avx512f amx_tile_extra\n", WITHOUT_TILES, False),  # a whole flag only
    ],
)
def test_only_advertised_amx_without_the_kernels_tile_state_is_unusable(
    cpuinfo: str, supported: int | None, unusable: bool
) -> None:
    assert tiles_unusable(cpuinfo, supported) is unusable
    assert WITH_TILES >> XFEATURE_XTILEDATA & 1 and not WITHOUT_TILES >> XFEATURE_XTILEDATA & 1


def test_the_guard_goes_first_on_the_engines_python_path(tmp_path: Path) -> None:
    env = engine_env({"PYTHONPATH": "/opt/other"}, guard=tmp_path)
    assert env["PYTHONPATH"].split(":") == [str(tmp_path), "/opt/other"]
    assert "PYTHONPATH" not in engine_env({})


def test_the_guarded_engine_process_sees_no_amx(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sitecustomize, in a real Python with torch, makes torch's answer False (what vLLM's
    kernels ask); without it torch answers as it does."""
    monkeypatch.setattr("bot.engine.amx.os_supported_features", lambda: WITHOUT_TILES)
    monkeypatch.setattr("bot.engine.amx.advertised", lambda cpuinfo: True)
    guard = guard_dir(tmp_path)
    assert guard is not None and (guard / "sitecustomize.py").is_file()
    ask = [sys.executable, "-c", "import torch; print(torch.cpu._is_amx_tile_supported())"]
    guarded = subprocess.run(ask, env=engine_env(guard=guard), capture_output=True, text=True,
                             check=True)  # fmt: skip
    assert guarded.stdout.strip() == "False", guarded.stderr
    monkeypatch.setattr("bot.engine.amx.advertised", lambda cpuinfo: False)
    assert guard_dir(tmp_path / "elsewhere") is None
