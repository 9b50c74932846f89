"""scripts/gpu_agent_check.sh, the device check, run here where there is no GPU: the agent is the
real `ruleloop agent` on the fake NVML (tests/fakes/nvml.py), and `nvidia-smi` a stand-in that
prints what the real one prints for `--query-gpu=... --format=csv,noheader,nounits`. This checks
the script's own logic (units, tolerances, exit codes); on a GPU machine it compares the real
NVML with the real nvidia-smi.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "scripts" / "gpu_agent_check.sh"
H200 = FIXTURES / "nvml" / "h200-x2.json"
# index, uuid, memory.used, memory.total (MiB), utilization.gpu, temperature.gpu, power.draw,
# enforced.power.limit (W), clocks.max.sm: what nvidia-smi prints for the fixture's two GPUs
SMI_ROWS = [
    "0, GPU-00000000-fake-0000, 139264, 143771, 97, 71, 612.34, 700.00, 1980",
    "1, GPU-00000000-fake-0001, 1, 143771, 100, 83, 699.81, 700.00, 1980",
]


def fake_smi(tmp_path: Path, rows: list[str]) -> Path:
    """A directory holding an `nvidia-smi` that prints ``rows`` for the script's query."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in --query-gpu=index,uuid,memory.used,memory.total,utilization.gpu,'
        "temperature.gpu,power.draw,enforced.power.limit,clocks.max.sm) ;; "
        '*) echo "unexpected query: $1" >&2; exit 9;; esac\n'
        "cat <<'EOF'\n" + "\n".join(rows) + "\nEOF\n"
    )
    smi.chmod(0o755)
    return bin_dir


def run_check(
    tmp_path: Path, rows: list[str] | None, *fake: str
) -> subprocess.CompletedProcess[str]:
    path = os.environ["PATH"]
    if rows is not None:
        path = f"{fake_smi(tmp_path, rows)}:{path}"
    env = {**os.environ, "PATH": path, "PYTHON": sys.executable,
           "AGENT_CMD": f"{sys.executable} -m tests.fakes.nvml {' '.join(fake)} -- agent"}  # fmt: skip
    return subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=180
    )


@pytest.fixture(autouse=True)
def _no_real_smi() -> None:
    if any((Path(p) / "nvidia-smi").exists() for p in os.environ["PATH"].split(":")):
        pytest.skip("a real nvidia-smi is here: run scripts/gpu_agent_check.sh itself")


def test_agreeing_readings_pass(tmp_path: Path) -> None:
    result = run_check(tmp_path, SMI_ROWS, "--fixture", str(H200))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "GPU 0 memory used (MiB): agent 139264.0, nvidia-smi [139264.0, 139264.0]" in result.stdout
    )
    assert "GPU 1 power draw (W): agent 699.8" in result.stdout
    assert result.stdout.rstrip().endswith("the agent agrees with nvidia-smi")


@pytest.mark.parametrize(
    ("row", "mismatch"),
    [
        (
            "1, GPU-00000000-fake-0001, 1, 143771, 100, 90, 699.81, 700.00, 1980",
            "GPU 1 temperature (C): agent 83.0, nvidia-smi [90.0, 90.0] (tolerance 3) MISMATCH",
        ),
        (
            "1, GPU-00000000-fake-0001, 4097, 143771, 100, 83, 699.81, 700.00, 1980",
            "GPU 1 memory used (MiB): agent 1.0, nvidia-smi [4097.0, 4097.0]",
        ),
        (
            "1, GPU-00000000-fake-0001, 1, 143771, 100, 83, 650.00, 700.00, 1980",
            "GPU 1 power draw (W): agent 699.8, nvidia-smi [650.0, 650.0]",
        ),
        (
            "1, GPU-00000000-fake-0001, 1, 143771, 40, 83, 699.81, 700.00, 1980",
            "GPU 1 utilisation (%): agent 100.0, nvidia-smi [40.0, 40.0]",
        ),
        (
            "1, GPU-ffffffff-other-0001, 1, 143771, 100, 83, 699.81, 700.00, 1980",
            "GPU 1 UUID: agent GPU-00000000-fake-0001, nvidia-smi GPU-ffffffff-other-0001",
        ),
    ],
    ids=["temperature", "memory", "power", "utilisation", "uuid"],
)
def test_a_mismatch_fails_and_says_where(tmp_path: Path, row: str, mismatch: str) -> None:
    result = run_check(tmp_path, [SMI_ROWS[0], row], "--fixture", str(H200))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "MISMATCHES:" in result.stdout and mismatch in result.stdout


def test_a_missing_gpu_fails(tmp_path: Path) -> None:
    result = run_check(tmp_path, SMI_ROWS[:1], "--fixture", str(H200))
    assert result.returncode == 1
    assert "GPU indexes: agent [0, 1], nvidia-smi [0]" in result.stdout


def test_without_nvidia_smi_it_cannot_check(tmp_path: Path) -> None:
    result = run_check(tmp_path, None, "--fixture", str(H200))
    assert result.returncode == 2 and "nvidia-smi not found" in result.stderr


def test_an_agent_without_nvml_cannot_be_checked(tmp_path: Path) -> None:
    result = run_check(tmp_path, SMI_ROWS, "--no-driver")
    assert result.returncode == 2
    assert "the agent answered HTTP 503" in result.stderr and "nvml_unavailable" in result.stderr
