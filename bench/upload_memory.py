"""Upload memory: what concurrent image searches of large query images cost a serving process.

    python bench/upload_memory.py --out bench/results/upload_memory-DATE.json
    python bench/upload_memory.py --code /tmp/ccrk-before ...   # the same against another checkout

Everything on 127.0.0.1: a synthetic catalogue of ``--items`` products indexed once, then for each scenario
a fresh ``ccrk serve`` (one process, the demo model, default settings) that first answers one small image
search (the model and index warm), then ``--clients`` clients upload the same large PNG at once (no
retries). A sampler reads the process's VmRSS every 20 ms. Recorded per scenario: RSS before, the peak and
its growth, RSS 3 s after the last answer, VmHWM, whether the peak stayed under the pod limit of
``deploy/k8s/api.yaml`` (2 GiB), the answers by status and the latency. Scenarios: a 4898 x 4898 16-bit
greyscale PNG (just under the 24 MP query limit; ~57 KB) with 8 and 40 clients, and a 4898 x 4898 RGBA PNG
with 8 clients. ``--code`` runs another checkout's code (PYTHONPATH) with the same venv and data. Prints a
JSON document, then a table; not a test.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
CCRK = str(Path(sys.executable).parent / "ccrk")
POD_LIMIT_MB = 2048
SIDE = 4898


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for {pid}")


def png(kind: str) -> bytes:
    buffer = io.BytesIO()
    if kind == "grey16":
        Image.fromarray(np.full((SIDE, SIDE), 30_000, dtype=np.uint16)).save(buffer, format="PNG")
    elif kind == "rgba":
        Image.new("RGBA", (SIDE, SIDE), (200, 40, 90, 128)).save(buffer, format="PNG")
    else:
        Image.new("RGB", (64, 64), (120, 40, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


def scenario(env: dict[str, str], data: bytes, clients: int) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = subprocess.Popen(
        [CCRK, "serve", "--port", str(port), "--index-name", "shop", "--log-level", "warning"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if serve.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("ccrk serve did not become ready")
            time.sleep(0.2)
        small = {"file": ("s.png", png("small"), "image/png")}
        assert httpx.post(url + "/v1/search/image", files=small, timeout=60).status_code == 200
        time.sleep(1.0)
        before = status_mb(serve.pid, "VmRSS:")
        peak = before
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, status_mb(serve.pid, "VmRSS:"))
                time.sleep(0.02)

        answers: list[tuple[int | None, float]] = []

        def upload() -> None:
            start = time.monotonic()
            try:
                files = {"file": ("big.png", data, "image/png")}
                status: int | None = httpx.post(
                    url + "/v1/search/image", files=files, timeout=180
                ).status_code
            except httpx.HTTPError:
                status = None
            answers.append((status, (time.monotonic() - start) * 1000.0))

        sampler = threading.Thread(target=sample)
        sampler.start()
        started = time.monotonic()
        threads = [threading.Thread(target=upload) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        wall = time.monotonic() - started
        time.sleep(3.0)
        stop.set()
        sampler.join()
        after = status_mb(serve.pid, "VmRSS:")
        hwm = status_mb(serve.pid, "VmHWM:")
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    latencies = sorted(ms for status, ms in answers if status == 200)
    return {
        "clients": clients,
        "upload_bytes": len(data),
        "statuses": dict(sorted(Counter(str(s) for s, _ in answers).items())),
        "rss_before_mb": round(before, 1),
        "rss_peak_mb": round(peak, 1),
        "rss_peak_growth_mb": round(peak - before, 1),
        "rss_after_3s_mb": round(after, 1),
        "vm_hwm_mb": round(hwm, 1),
        "under_pod_limit": max(peak, hwm) < POD_LIMIT_MB,
        "wall_s": round(wall, 1),
        "latency_ms_p50_200": round(float(np.percentile(latencies, 50)), 1) if latencies else None,
        "latency_ms_max_200": round(latencies[-1], 1) if latencies else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--code", type=Path, default=ROOT, help="Checkout whose code serves (PYTHONPATH).")
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="ccrk-upload-mem-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCRK_")}
    env |= {"CCRK_INDEX_ROOT": str(tmp / "indexes"), "CCRK_THREADS": "1", "PYTHONPATH": str(args.code)}
    results = []
    try:
        for cmd in (
            ["data", "synth", "--out", str(tmp / "cat"), "--n-train", "0", "--n-val", "0",
             "--n-test", str(args.items), "--seed", "0"],
            ["index", "build", "--name", "shop", str(tmp / "cat" / "test.jsonl")],
        ):  # fmt: skip
            done = subprocess.run(
                [CCRK, *cmd], env=env, capture_output=True, text=True, cwd=ROOT, timeout=900
            )
            if done.returncode:
                raise RuntimeError(done.stderr[-2000:])
        for kind, clients in (("grey16", 8), ("grey16", 40), ("rgba", 8)):
            row = {"image": f"{SIDE}x{SIDE} {'16-bit greyscale' if kind == 'grey16' else 'RGBA'} PNG"}
            results.append(row | scenario(env, png(kind), clients))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    result = {
        "benchmark": "upload_memory",
        "command": "python bench/upload_memory.py " + shlex.join(sys.argv[1:]),
        "code": args.label,
        "setup": {"items": args.items, "workers": 1, "pod_limit_mb": POD_LIMIT_MB, "cpus": os.cpu_count()},
        "scenarios": results,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(f"\n{args.label}")
    print(f"{'image':<30}{'clients':>8}{'before':>8}{'peak':>8}{'growth':>8}{'after':>8}  statuses")
    for r in results:
        print(f"{r['image']:<30}{r['clients']:>8}{r['rss_before_mb']:>8.0f}{r['rss_peak_mb']:>8.0f}"
              f"{r['rss_peak_growth_mb']:>8.0f}{r['rss_after_3s_mb']:>8.0f}  {r['statuses']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
