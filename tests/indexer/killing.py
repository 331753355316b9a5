"""Killing a real `ccrk index build` process (kill -9) once it has written some of its shards."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def kill_after_shards(
    proc: subprocess.Popen[bytes],
    root: Path,
    pattern: str,
    shards: int,
    *,
    timeout_s: float = 60.0,
    log: Path | None = None,
) -> int:
    """SIGKILL ``proc`` as soon as ``shards`` files match ``pattern`` under ``root`` (``timeout_s`` at most;
    ``log``: the process's output, quoted when it ended first); the number of shard files found after it
    died."""
    deadline = time.monotonic() + timeout_s
    try:
        while len(list(root.glob(pattern))) < shards:
            assert proc.poll() is None, "the build ended before it could be killed" + (
                f": {log.read_text()[-2000:]}" if log is not None else ""
            )
            assert time.monotonic() < deadline, f"no shard written within {timeout_s:.0f} s"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return len(list(root.glob(pattern)))
