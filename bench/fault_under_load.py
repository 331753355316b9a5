"""Faults under load: what a running service loses while its index is swapped, its Redis is killed and
restarted, one of its worker processes is killed with SIGKILL, and a build fails on a full disk.

    sudo python bench/fault_under_load.py --out bench/results/fault_under_load-DATE.json

Everything on 127.0.0.1: a catalogue of ``--items`` synthetic products indexed into an index root on a
small tmpfs (root is needed to mount it; without it the disk-full fault is skipped with the reason), a
redis-server of its own, ``ccrk serve --workers 2`` with Redis caches, and a load generator sending
``--rate`` text searches per second (Poisson arrivals, ``--clients`` connections, no retries) for
``--seconds``. Faults at fixed times; every request is recorded with its outcome, and each fault's window
(from the fault to 5 s after it) is summarised: requests, failures by kind, latency p50/p99, the index
versions answered. Prints a JSON document, then a table; not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CCRK = str(Path(sys.executable).parent / "ccrk")
WINDOW_S = 5.0


@dataclass
class Outcome:
    start: float
    latency_ms: float
    status: int | None  # None: no HTTP answer (connection refused, reset, timeout)
    error: str | None = None
    version: str | None = None


@dataclass
class Fault:
    name: str
    at: float
    ok: bool = True
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ccrk(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CCRK, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def wait_http(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer 200 within {seconds} s")


def start_redis(port: int) -> subprocess.Popen[bytes]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed")
    return subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]


def catalogue_queries(catalogue: Path) -> list[str]:
    """Every caption of the catalogue, in every language: a query mix where caches hit now and then."""
    records = [json.loads(line) for line in catalogue.read_text("utf-8").splitlines() if line.strip()]
    return [text for r in records for texts in r["captions"].values() for text in texts]


async def load(
    url: str, queries: list[str], rate: float, clients: int, seconds: float, t0: float
) -> list[Outcome]:
    """Open-loop Poisson arrivals over a pool of keep-alive connections; latency from arrival. Re-ranking
    off: the faults, not the fusion encoder's cost, are measured."""
    outcomes: list[Outcome] = []
    rng = random.Random(0)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=10, limits=limits) as client:
        tasks = []

        async def one(arrival: float) -> None:
            query = rng.choice(queries)
            try:
                body = {"query": query, "top_k": 10, "rerank": False}
                response = await client.post("/v1/search", json=body)
                version = response.json().get("index_version") if response.status_code == 200 else None
                outcome = Outcome(arrival - t0, 0.0, response.status_code, None, version)
            except httpx.HTTPError as exc:
                outcome = Outcome(arrival - t0, 0.0, None, type(exc).__name__)
            outcome.latency_ms = (time.monotonic() - arrival) * 1000.0
            outcomes.append(outcome)

        next_at = time.monotonic()
        end = t0 + seconds
        while next_at < end:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            tasks.append(asyncio.create_task(one(next_at)))
            next_at += rng.expovariate(rate)
        await asyncio.gather(*tasks)
    return outcomes


def summary(outcomes: list[Outcome], start: float, end: float) -> dict[str, Any]:
    window = [o for o in outcomes if start <= o.start < end]
    failed = [o for o in window if o.status != 200]
    latencies = [o.latency_ms for o in window if o.status == 200]
    return {
        "from_s": round(start, 1),
        "to_s": round(end, 1),
        "requests": len(window),
        "failed": len(failed),
        "failures": dict(Counter(o.error or f"http {o.status}" for o in failed)),
        "latency_ms_p50": round(float(np.percentile(latencies, 50)), 1) if latencies else None,
        "latency_ms_p99": round(float(np.percentile(latencies, 99)), 1) if latencies else None,
        "index_versions": sorted({o.version for o in window if o.version}),
    }


def mount_tmpfs(path: Path, size_mb: int) -> str | None:
    """None when mounted, else why not."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
    except OSError as exc:
        return f"mount failed: {exc}"
    return None if done.returncode == 0 else f"mount failed: {done.stderr.strip()}"


def fill_disk(path: Path, leave_bytes: int) -> Path:
    """A filler file using all but ``leave_bytes`` of the filesystem holding ``path``."""
    filler = path / "filler.bin"
    free = shutil.disk_usage(path).free
    with open(filler, "wb") as fh:
        fh.truncate(0)
        os.posix_fallocate(fh.fileno(), 0, max(0, free - leave_bytes))
    return filler


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=600)
    parser.add_argument("--rate", type=float, default=80.0, help="Searches per second (open loop).")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=70.0)
    parser.add_argument("--tmpfs-mb", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="ccrk-faults-"))
    root = tmp / "indexes"
    no_mount = mount_tmpfs(root, args.tmpfs_mb)
    redis_port, port = free_port(), free_port()
    redis = start_redis(redis_port)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCRK_")}
    env |= {"CCRK_INDEX_ROOT": str(root), "CCRK_THREADS": "1", "CCRK_INDEX_POLL_S": "0.5"}
    serve: subprocess.Popen[bytes] | None = None
    faults: list[Fault] = []
    try:
        for split, seed in (("a", 0), ("b", 1)):
            done = ccrk("data", "synth", "--out", str(tmp / split), "--n-train", "0", "--n-val", "0",
                        "--n-test", str(args.items), "--seed", str(seed), env=env)  # fmt: skip
            if done.returncode:
                raise RuntimeError(done.stderr)
        built = ccrk("index", "build", "--name", "shop", str(tmp / "a" / "test.jsonl"), env=env)
        if built.returncode:
            raise RuntimeError(built.stderr)
        serve = subprocess.Popen(
            [CCRK, "serve", "--port", str(port), "--index-name", "shop", "--workers", "2",
             "--redis-url", f"redis://127.0.0.1:{redis_port}/0", "--log-level", "warning"],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/readyz", 120)
        time.sleep(2.0)  # both processes up

        t0 = time.monotonic()

        def at(seconds: float) -> None:
            time.sleep(max(0.0, t0 + seconds - time.monotonic()))

        def faults_thread() -> None:
            nonlocal redis
            at(8)
            swap = Fault("index swap", time.monotonic() - t0)
            done = ccrk("index", "build", "--name", "shop", str(tmp / "b" / "test.jsonl"), env=env)
            swap.ok, swap.detail = done.returncode == 0, f"build exit {done.returncode}"
            faults.append(swap)
            at(22)
            faults.append(Fault("Redis killed (SIGKILL)", time.monotonic() - t0))
            redis.kill()
            redis.wait()
            at(30)
            faults.append(Fault("Redis restarted", time.monotonic() - t0))
            redis = start_redis(redis_port)
            at(40)
            workers = children(serve.pid) if serve is not None else []
            kill = Fault("worker killed (SIGKILL)", time.monotonic() - t0, detail=f"processes {workers}")
            if workers:
                os.kill(workers[0], signal.SIGKILL)
            else:
                kill.ok, kill.detail = False, "no worker process found"
            faults.append(kill)
            at(52)
            disk = Fault("disk full during a build", time.monotonic() - t0)
            if no_mount:
                disk.ok, disk.detail = False, f"skipped: {no_mount}"
            else:
                filler = fill_disk(root, 256 * 1024)
                try:
                    done = ccrk("index", "build", "--name", "shop", str(tmp / "a" / "test.jsonl"), env=env)
                    disk.detail = f"build exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
                    disk.extra = {"build_exit": done.returncode, "message": done.stderr.strip()[-400:]}
                    disk.ok = done.returncode != 0
                finally:
                    filler.unlink()
            faults.append(disk)

        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=faults_thread)
        thread.start()
        queries = catalogue_queries(tmp / "a" / "test.jsonl")
        outcomes = loop.run_until_complete(load(url, queries, args.rate, args.clients, args.seconds, t0))
        thread.join()
        ready_after = httpx.get(url + "/readyz", timeout=5).json()
    finally:
        if serve is not None:
            serve.terminate()
            serve.wait(timeout=30)
        redis.kill()
        if not no_mount:
            subprocess.run(["umount", str(root)], check=False)
        shutil.rmtree(tmp, ignore_errors=True)

    result = {
        "benchmark": "fault_under_load",
        "command": "sudo python bench/fault_under_load.py " + shlex.join(sys.argv[1:]),
        "setup": {
            "items": args.items, "rate_per_s": args.rate, "clients": args.clients, "seconds": args.seconds,
            "workers": 2, "retries": 0, "index_root_tmpfs_mb": None if no_mount else args.tmpfs_mb,
        },
        "overall": summary(outcomes, 0.0, args.seconds + 1),
        "baseline": summary(outcomes, 2.0, 8.0),
        "faults": [
            {"fault": f.name, "at_s": round(f.at, 1), "ok": f.ok, "detail": f.detail, **f.extra,
             "window": summary(outcomes, f.at, f.at + WINDOW_S)}
            for f in faults
        ],
        "ready_after": ready_after,
    }  # fmt: skip
    text = json.dumps(result, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(f"\n{'window':<28}{'at s':>6}{'requests':>10}{'failed':>8}{'p50 ms':>8}{'p99 ms':>8}  failures")
    rows = [("baseline (no fault)", 2.0, result["baseline"])]
    rows += [(f["fault"], f["at_s"], f["window"]) for f in result["faults"]]
    for name, t, w in rows:
        print(f"{name:<28}{t:>6}{w['requests']:>10}{w['failed']:>8}{w['latency_ms_p50'] or 0:>8}"
              f"{w['latency_ms_p99'] or 0:>8}  {w['failures']}")  # fmt: skip
    o = result["overall"]
    print(f"overall: {o['requests']} requests, {o['failed']} failed {o['failures']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
