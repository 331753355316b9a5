"""Fair share under load: a polite client (5 queries/s on its own API key) beside 1, 4 and 16 greedy
connections (on one key of their own, on a key each, or anonymous), with limits off (the shipped defaults:
no rate limits, no per-caller cap, the search slots shared fairly among the callers waiting) and on.

    .venv/bin/python bench/fair_share.py --out bench/results/fair_share-DATE.json

Everything on 127.0.0.1: an HNSW index of ``--items`` synthetic items (``bench/search_load.build_index``),
``ccrk serve`` (one process, Redis for caches and buckets: a db and key prefix of its own, removed at the
end), keys made with ``ccrk keys create``. The polite client sends open-loop (Poisson arrivals, latency from
the arrival) on one keep-alive connection; the greedy connections run in another process (at nice 10: on one
machine, the load generator's CPU should not be taken from the server), closed-loop, as fast as the
server answers; on a 429 they wait its Retry-After (``--greedy ignore``: they send again at
once). Limits on: greedy keys ``--rate 50/s --burst 50`` each, anonymous addresses 50/s, and
CCRK_MAX_CONCURRENT_PER_CALLER 1 (of 4 search workers); off: none of these. ``--rounds R`` runs every row R
times, interleaved, and pools the polite client's requests (the machine's load drifts).

Reported per run: the polite client's p50/p99 (and how many of its requests failed), the greedy requests
admitted per second, their 429s and whether every 429 carried Retry-After. Then requests/s of 8 closed-loop
connections with keys off (anonymous), on (a key, no rate) and on with a bucket (a key of 1e6/s: one Redis
round trip each), and the fair-share cost per request measured in process (key lookup + bucket, p50/p99 in
microseconds, Redis and in-process). Prints a JSON document, then a table; not a test.

A little over 400 lines because it holds the whole experiment in one place: the polite open loop, the greedy
closed loop in a process of its own, the throughput runs, the in-process cost and the report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.search_load import build_index, queries  # noqa: E402
from ccrk_settings import Settings  # noqa: E402

CCRK = str(Path(sys.executable).parent / "ccrk")
GREEDY_RATE = "50/s"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request_bytes(body: bytes, key: str | None) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (
        f"POST /v1/search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes
) -> tuple[int, dict[bytes, bytes]]:
    writer.write(data)
    status = int((await reader.readline()).split()[1])
    headers: dict[bytes, bytes] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    await reader.readexactly(int(headers.get(b"content-length", b"0")))
    return status, headers


async def greedy_load(
    port: int, bodies: list[bytes], keys: list[str | None], seconds: float, honour: bool
) -> dict[str, Any]:
    codes: Counter[int] = Counter()
    retry_after: Counter[bool] = Counter()
    until = time.perf_counter() + seconds

    async def one(c: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        i = c * 31
        try:
            while time.perf_counter() < until:
                status, headers = await exchange(
                    reader, writer, request_bytes(bodies[i % len(bodies)], keys[c])
                )
                i += 1
                codes[status] += 1
                if status == 429:
                    retry_after[b"retry-after" in headers] += 1
                    if honour:
                        wait = float(headers.get(b"retry-after", b"1"))
                        await asyncio.sleep(min(wait, until - time.perf_counter()))
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(one(c) for c in range(len(keys))))
    elapsed = time.perf_counter() - start
    return {
        "admitted_per_s": round(codes[200] / elapsed, 1),
        "refused_429_per_s": round(codes[429] / elapsed, 1),
        "other_statuses": {str(k): v for k, v in codes.items() if k not in (200, 429)},
        "every_429_has_retry_after": retry_after[False] == 0,
    }


def greedy_process(
    nice: int, port: int, bodies: list[bytes], keys: list[str | None], seconds: float, honour: bool, out: Any
) -> None:
    os.setpriority(os.PRIO_PROCESS, 0, nice)  # its CPU is another machine's in production
    out.put(asyncio.run(greedy_load(port, bodies, keys, seconds, honour)))


async def polite_load(
    port: int, bodies: list[bytes], key: str, rate: float, seconds: float
) -> dict[str, Any]:
    rng = random.Random(5)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.perf_counter()
    arrival, latencies, failed, i = start, [], 0, 0
    try:
        while True:
            arrival += rng.expovariate(rate)
            if arrival > start + seconds:
                break
            await asyncio.sleep(max(0.0, arrival - time.perf_counter()))
            status, _ = await exchange(reader, writer, request_bytes(bodies[i % len(bodies)], key))
            i += 1
            latencies.append((time.perf_counter() - arrival) * 1000)  # from the arrival: waits included
            failed += status != 200
    finally:
        writer.close()
    return {"latencies_ms": latencies, "failed": failed}


def polite_summary(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The polite client's requests of every round, pooled."""
    lat = np.array([x for part in parts for x in part["latencies_ms"]])
    return {
        "requests": len(lat),
        "failed": sum(part["failed"] for part in parts),
        "p50_ms": round(float(np.percentile(lat, 50)), 2),
        "p99_ms": round(float(np.percentile(lat, 99)), 2),
    }


def greedy_summary(parts: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(parts)
    statuses: Counter[str] = Counter()
    for part in parts:
        statuses.update(part["other_statuses"])
    return {
        "admitted_per_s": round(sum(p["admitted_per_s"] for p in parts) / n, 1),
        "refused_429_per_s": round(sum(p["refused_429_per_s"] for p in parts) / n, 1),
        "other_statuses": dict(statuses),
        "every_429_has_retry_after": all(p["every_429_has_retry_after"] for p in parts),
    }


def run_pair(
    port: int, bodies: list[bytes], polite_key: str, greedy_keys: list[str | None], args: argparse.Namespace
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    proc = None
    if greedy_keys:
        queue: Any = multiprocessing.get_context("spawn").Queue()
        proc = multiprocessing.get_context("spawn").Process(
            target=greedy_process,
            args=(
                args.greedy_nice,
                port,
                bodies,
                greedy_keys,
                args.seconds + 1.0,
                args.greedy == "honour",
                queue,
            ),
        )
        proc.start()
        time.sleep(1.0)  # the greedy connections at full speed before the polite client starts
    result["polite"] = asyncio.run(polite_load(port, bodies, polite_key, args.polite_rate, args.seconds))
    if proc is not None:
        result["greedy"] = queue.get(timeout=60)
        proc.join(timeout=30)
    return result


async def closed_loop(
    port: int, bodies: list[bytes], key: str | None, connections: int, seconds: float
) -> float:
    done = 0
    until = time.perf_counter() + seconds

    async def one(c: int) -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        i = c * 17
        while time.perf_counter() < until:
            status, _ = await exchange(reader, writer, request_bytes(bodies[i % len(bodies)], key))
            assert status == 200, status
            i += 1
            done += 1
        writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(one(c) for c in range(connections)))
    return round(done / (time.perf_counter() - start), 1)


def in_process_cost(root: Path, redis_url: str, prefix: str, n: int = 5000) -> dict[str, Any]:
    """Microseconds per request of what a search route adds: the key lookup, the bucket (Redis script, or
    in process), the headers."""
    from service.keys import KeyRing, KeyStore
    from service.ratelimit import Limit, RateLimiter

    record, key = KeyStore(root).create("search", [], rate=1e6, burst=10**6, name="bench-overhead")
    ring = KeyRing(root)
    out: dict[str, Any] = {}
    for backend, url in (("redis", redis_url), ("memory", None)):
        limiter = RateLimiter(redis_url=url, prefix=prefix, timeout_s=0.5, retry_s=1.0)
        limit = Limit(rate=1e6, burst=10**6)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            found = ring.lookup(key)
            assert found is not None
            limiter.check(f"key:{found.id}", limit).headers()
            times.append((time.perf_counter() - t0) * 1e6)
        limiter.close()
        out[backend] = {
            "p50_us": round(float(np.percentile(times, 50)), 1),
            "p99_us": round(float(np.percentile(times, 99)), 1),
        }
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        ring.lookup(key)
        times.append((time.perf_counter() - t0) * 1e6)
    out["key_lookup_only"] = {"p50_us": round(float(np.percentile(times, 50)), 1)}
    KeyStore(root).revoke(record.id)
    return out


def serve(root: Path, name: str, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            CCRK,
            "serve",
            "--port",
            str(port),
            "--index-root",
            str(root),
            "--index-name",
            name,
            "--log-level",
            "warning",
        ],
        env=env,
        cwd=ROOT,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("ccrk serve did not become ready")


def keys_create(root: Path, *args: str) -> str:
    done = subprocess.run(
        [CCRK, "keys", "create", "--index-root", str(root), *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return done.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--root", type=Path, default=ROOT / "artifacts" / "bench-fair-share")
    parser.add_argument("--seconds", type=float, default=12.0, help="per run")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every row, interleaved, pooled")
    parser.add_argument("--throughput-seconds", type=float, default=10.0)
    parser.add_argument("--polite-rate", type=float, default=5.0)
    parser.add_argument("--greedy", choices=("honour", "ignore"), default="honour", help="on a 429")
    parser.add_argument("--counts", default="1,4,16")
    parser.add_argument(
        "--greedy-nice",
        type=int,
        default=10,
        help="the greedy load generator's nice (its CPU not the server's)",
    )
    parser.add_argument("--greedy-burst", type=int, default=50, help="bucket size of the greedy keys")
    parser.add_argument(
        "--concurrent-per-caller", type=int, default=1, help="CCRK_MAX_CONCURRENT_PER_CALLER, limits on"
    )
    parser.add_argument("--modes", default="same_key,own_keys,anonymous")
    parser.add_argument("--limits", default="off,on", help="off: the shipped defaults; on: the limits above")
    parser.add_argument("--search-workers", type=int, default=None, help="CCRK_SEARCH_WORKERS (default: its)")
    parser.add_argument("--threads", type=int, default=None, help="CCRK_THREADS (default: the shipped one)")
    parser.add_argument("--rerank", action="store_true", help="re-rank every search (default: off)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    texts = queries()
    name = build_index(args.root, args.items, texts, 0.95)
    bodies = [json.dumps({"query": t, "top_k": 10, "rerank": args.rerank}).encode() for t in texts]
    prefix = f"bench-fair-{uuid.uuid4().hex[:8]}:"
    counts = [int(c) for c in args.counts.split(",")]
    modes = args.modes.split(",")
    port = free_port()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("CCRK_")}
    base_env.update(
        {
            "CCRK_REDIS_URL": args.redis_url,
            "CCRK_CACHE_PREFIX": prefix,
            "CCRK_ANN_SAMPLE_RATE": "0",
            "CCRK_HISTORY_DB": str(Path(tempfile.mkdtemp(prefix="ccrk-bench-")) / "h.sqlite"),
        }
    )
    if args.search_workers:
        base_env["CCRK_SEARCH_WORKERS"] = str(args.search_workers)
    if args.threads:
        base_env["CCRK_THREADS"] = str(args.threads)
    polite = keys_create(args.root, "--name", "polite")
    greedy: dict[str, dict[str, list[str | None]]] = {}
    for limits in ("off", "on"):
        rate = ["--rate", GREEDY_RATE, "--burst", str(args.greedy_burst)] if limits == "on" else []
        shared = keys_create(args.root, *rate, "--name", f"greedy-{limits}")
        own = [keys_create(args.root, *rate, "--name", f"greedy-{limits}-{i}") for i in range(max(counts))]
        greedy[limits] = {
            "same_key": [shared] * max(counts),
            "own_keys": own,
            "anonymous": [None] * max(counts),
        }
    runs: list[dict[str, Any]] = []
    throughput: dict[str, float] = {}
    client = redis.Redis.from_url(args.redis_url)
    try:
        for limits in args.limits.split(","):
            env = dict(base_env)
            if limits == "on":
                env.update(
                    {
                        "CCRK_ANONYMOUS_RATE": "50",
                        "CCRK_ANONYMOUS_BURST": "50",
                        "CCRK_MAX_CONCURRENT_PER_CALLER": str(args.concurrent_per_caller),
                    }
                )
            proc = serve(args.root, name, port, env)
            try:
                asyncio.run(closed_loop(port, bodies, polite, 4, 3.0))  # warm-up: caches, first runs
                rows = [("alone", 0)] + [(mode, n) for mode in modes for n in counts]
                parts: dict[tuple[str, int], list[dict[str, Any]]] = {row: [] for row in rows}
                # Rounds, each row once per round: slow drifts of the machine's load reach every row alike.
                for _ in range(args.rounds):
                    for mode, n in rows:
                        keys = greedy[limits][mode][:n] if n else []
                        parts[(mode, n)].append(run_pair(port, bodies, polite, keys, args))
                for mode, n in rows:
                    row: dict[str, Any] = {"limits": limits, "mode": mode, "greedy_connections": n}
                    row["polite"] = polite_summary([p["polite"] for p in parts[(mode, n)]])
                    if n:
                        row["greedy"] = greedy_summary([p["greedy"] for p in parts[(mode, n)]])
                    runs.append(row)
                    print(f"limits {limits} {mode} x{n}: {row}", file=sys.stderr)
                if limits == "off" and args.throughput_seconds > 0:
                    bucket = keys_create(
                        args.root, "--rate", "1000000/s", "--burst", "1000000", "--name", "bench-bucket"
                    )
                    cases = {
                        "keys_off_anonymous": None,
                        "keys_on_no_rate": polite,
                        "keys_on_redis_bucket": bucket,
                    }
                    rates: dict[str, list[float]] = {case: [] for case in cases}
                    for _ in range(args.rounds):  # interleaved, averaged
                        for case, key in cases.items():
                            rates[case].append(
                                asyncio.run(closed_loop(port, bodies, key, 8, args.throughput_seconds))
                            )
                    throughput = {case: round(float(np.mean(r)), 1) for case, r in rates.items()}
            finally:
                proc.terminate()
                proc.wait(timeout=60)
        cost = in_process_cost(args.root, args.redis_url, prefix)
    finally:
        stale = list(client.scan_iter(match=prefix + "*"))
        if stale:
            client.delete(*stale)
        client.close()
        (args.root / "api-keys.json").unlink(missing_ok=True)

    alone = {r["limits"]: r["polite"]["p99_ms"] for r in runs if r["mode"] == "alone"}
    for r in runs:
        r["polite_p99_vs_alone"] = round(r["polite"]["p99_ms"] / alone[r["limits"]], 2)
    document = {
        "command": "python " + " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores (shared with other work)",
        "items": args.items,
        "index": name,
        "seconds_per_run": args.seconds,
        "rounds": args.rounds,
        "polite_rate": args.polite_rate,
        "greedy_on_429": args.greedy,
        "greedy_client_nice": args.greedy_nice,
        "greedy_limit": f"{GREEDY_RATE} burst {args.greedy_burst} (limits on; anonymous 50/s burst 50)",
        "max_concurrent_per_caller": f"{args.concurrent_per_caller} (limits on; off: 0)",
        "search_workers": args.search_workers or Settings().search_slots(),
        "encoder_threads": args.threads or Settings().threads,
        "rerank": args.rerank,
        "runs": runs,
        "requests_per_s_8_connections": throughput,
        "fair_share_cost_in_process": cost,
    }
    text = json.dumps(document, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    head = ("limits", "greedy", "conns", "polite p50", "p99", "x alone", "admitted/s", "429/s", "Retry-After")
    print("\n" + "".join(f"{h:>12}" for h in head))
    for r in runs:
        g = r.get("greedy", {})
        cells = (
            r["limits"],
            r["mode"],
            r["greedy_connections"],
            f"{r['polite']['p50_ms']:.1f} ms",
            f"{r['polite']['p99_ms']:.1f} ms",
            f"{r['polite_p99_vs_alone']:.2f}",
            g.get("admitted_per_s", "-"),
            g.get("refused_429_per_s", "-"),
            g.get("every_429_has_retry_after", "-"),
        )
        print("".join(f"{c!s:>12}" for c in cells))
    print(f"\nrequests/s (8 connections): {throughput}")
    print(f"fair-share cost per request (in process): {cost}")


if __name__ == "__main__":
    main()
