"""bench/gpu_session.sh, the one prepared run on a lent GPU machine, rehearsed on a machine without one:
make gpu-check stops at once (exit 2), and gpu_scale still runs on the CPU and writes its figures."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
no_gpu = pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU driver")


def test_the_script_parses() -> None:
    done = subprocess.run(
        ["bash", "-n", str(ROOT / "bench" / "gpu_session.sh")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


@no_gpu
def test_the_session_script_rehearses_its_cpu_path(tmp_path: Path) -> None:
    env = dict(
        os.environ, OUT_DIR=str(tmp_path), SIZES="3000", QUERIES="300", SESSION_S="300",
        SCALE_PYTHON=sys.executable, SCALE_ARGS="--no-encode --methods ivf --recall-queries 100",
    )  # fmt: skip
    env.pop("OUT", None)
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_session.sh")], capture_output=True, text=True, timeout=300,
        cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    log = (tmp_path / "session.log").read_text()
    assert "== no nvidia-smi or no GPU: a CPU rehearsal" in log
    assert "gpu-check: FAILED: no CUDA GPU on this machine" in log and "== make gpu-check: exit 2" in log
    assert not (tmp_path / "gpu-check.json").exists()
    result = json.loads((tmp_path / "gpu-scale.json").read_text())
    assert result["settings"]["budget_s"] is not None and result["sizes"][0]["n"] == 3000
    assert "| 3,000 | IVF256,Flat | cpu |" in log
    assert "== gpu_scale: exit 0" in log
