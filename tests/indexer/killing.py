"""Killing a real `ccrk index build` process (kill -9) once it has written some of its shards."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def kill_after_shards(proc: subprocess.Popen[bytes], root: Path, pattern: str, shards: int) -> int:
    """SIGKILL ``proc`` as soon as ``shards`` files match ``pattern`` under ``root`` (60 s at most); the
    number of shard files found after it died."""
    deadline = time.monotonic() + 60
    try:
        while len(list(root.glob(pattern))) < shards:
            assert proc.poll() is None, "the build ended before it could be killed"
            assert time.monotonic() < deadline, "no shard written within 60 s"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return len(list(root.glob(pattern)))
