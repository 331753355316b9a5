"""`make gpu-check` on a machine without a CUDA GPU: it stops at once, checks nothing, says why, exits 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    shutil.which("nvidia-smi") is not None, reason="this machine has a GPU driver"
)


def test_the_script_fails_clearly_without_a_gpu(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "no CUDA GPU on this machine" in done.stderr and "nothing was checked" in done.stderr
    assert not out.exists()  # no figures are written for a run that checked nothing


def test_make_gpu_check_fails_before_installing_anything() -> None:
    env = dict(os.environ, GPU_CHECK_PYTHON="false")  # would fail differently if it got past the GPU gate
    done = subprocess.run(
        ["make", "--no-print-directory", "gpu-check"], capture_output=True, text=True, timeout=60, cwd=ROOT,
        env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "gpu-check: FAILED: no CUDA GPU on this machine" in done.stderr
