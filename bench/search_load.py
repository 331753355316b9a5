"""Load benchmark of the search service: a real `ccrk serve` (uvicorn) on loopback, N synthetic items.

Item vectors are synthetic (clustered, L2-normalised, 128-d like the demo model) so that 100k and 1M items
need no encoding; queries are real multilingual captions of the synthetic catalogue encoded by the real
demo model inside the service. The re-rank store is a sparse all-zero file of the real shape (65 x 128
fp16 per item): the fusion encoder does its full work, the page cache serves the zeros (no disk reads).

Measures p50/p95/p99 latency and throughput at concurrency 1, 8 and 32 with re-ranking off and on, the
service's own stage timings (encode, search, rerank, total) and, in this process, the floors: query
encoding, ANN search and exact (brute-force) search over the same index. The load generator is a minimal
asyncio HTTP/1.1 keep-alive client, so it costs the shared CPU as little as possible. Prints JSON and a
table; not a test.

    python bench/search_load.py --items 100000 [--items 1000000] [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import faiss
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ccrk_settings import DEFAULT_MODEL_DIR  # noqa: E402
from indexer import index_format as fmt  # noqa: E402

DIM, TOKENS, WIDTH = 128, 65, 128
TARGETS = {  # (concurrency, rerank) -> targets of issue 5 (2 cores, 1M items)
    (1, False): {"p50_ms": 5.0},
    (32, False): {"p99_ms": 25.0, "qps": 400.0},
    (1, True): {"p50_ms": 60.0},
}


def build_index(root: Path, n: int, seed: int = 0) -> str:
    name = f"bench{n}"
    existing = fmt.current_version(root, name)
    if existing:
        return name
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(1024, DIM)).astype(np.float32)
    version = fmt.new_version_name(root, name)
    stage = root / name / fmt.BUILDS_DIR / version
    stage.mkdir(parents=True)
    embeds = np.lib.format.open_memmap(stage / fmt.EMBEDDINGS_FILE, "w+", np.float32, (n, DIM))
    for start in range(0, n, 100_000):
        m = min(100_000, n - start)
        x = centres[rng.integers(0, 1024, m)] + 0.6 * rng.normal(size=(m, DIM)).astype(np.float32)
        embeds[start : start + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    embeds.flush()
    t0 = time.perf_counter()
    index = faiss.IndexHNSWFlat(DIM, 32, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = 64
    index.add(np.asarray(embeds))
    index.hnsw.efSearch = 64
    faiss.write_index(index, str(stage / fmt.INDEX_FILE))
    print(f"HNSW32 over {n} items built in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    # Sparse zero re-rank store of the real shape (only the header is written).
    np.lib.format.open_memmap(stage / fmt.RERANK_FILE, "w+", np.float16, (n, TOKENS, WIDTH)).flush()
    categories = ("mug", "hat", "bag", "shoe", "lamp", "car", "umbrella", "t_shirt")
    fmt.write_metadata(
        stage / fmt.METADATA_FILE,
        (
            (i, f"item-{i:07d}", None, {"category": categories[i % 8], "price": float(i % 500)}, False)
            for i in range(n)
        ),
    )
    fmt.IndexManifest(
        format_version=fmt.FORMAT_VERSION,
        name=name,
        version=version,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        model_name=fmt.model_name_of(DEFAULT_MODEL_DIR),
        model_fingerprint=fmt.model_fingerprint(DEFAULT_MODEL_DIR),
        embed_dim=DIM,
        preprocessing={},
        count=n,
        index_factory="HNSW32",
        search_params={"efSearch": 64},
        measured_recall_at_10=None,
        language_recall_at_10={},
        build_seconds=0.0,
        skipped=[],
        checksums={},
        rerank={"dtype": "fp16", "tokens": TOKENS, "width": WIDTH, "bytes_per_image": TOKENS * WIDTH * 2},
        parent_version=None,
        total_rows=n,
    ).save(stage / fmt.MANIFEST_FILE)
    fmt.install_version(root, name, stage, version)
    fmt.publish_version(root, name, version)
    return name


def queries(n: int = 400) -> list[str]:
    """Real captions of the synthetic catalogue in its ten languages (first phrasing, shortened a bit)."""
    from model.data.synth import SynthConfig, iter_items

    out: list[str] = []
    for item in iter_items("test", SynthConfig(seed=3, n_train=0, n_val=0, n_test=n // 10 + 1)):
        for texts in item.captions.values():
            out.append(" ".join(texts[0].split()[:8]))
    return out[:n]


async def _client(
    host: str,
    port: int,
    bodies: list[bytes],
    until: float,
    lat: list[float],
    server_ms: list[dict[str, float]],
    errors: list[str],
    offset: int,
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    i = offset
    try:
        while time.perf_counter() < until:
            body = bodies[i % len(bodies)]
            i += 1
            head = (
                f"POST /v1/search HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            start = time.perf_counter()
            writer.write(head + body)
            status_line = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            payload = await reader.readexactly(length)
            lat.append(time.perf_counter() - start)
            if b" 200 " not in status_line:
                errors.append(status_line.decode().strip())
                continue
            server_ms.append(json.loads(payload)["timings_ms"])
    finally:
        writer.close()


async def run_load(port: int, bodies: list[bytes], concurrency: int, seconds: float) -> dict[str, float]:
    # Warm-up (connections, caches of the OS, ONNX Runtime's first runs).
    await asyncio.gather(
        *[
            _client("127.0.0.1", port, bodies, time.perf_counter() + 1.0, [], [], [], c * 7)
            for c in range(concurrency)
        ]
    )
    lat: list[float] = []
    server_ms: list[dict[str, float]] = []
    errors: list[str] = []
    start = time.perf_counter()
    until = start + seconds
    await asyncio.gather(
        *[
            _client("127.0.0.1", port, bodies, until, lat, server_ms, errors, 1000 + c * 13)
            for c in range(concurrency)
        ]
    )
    elapsed = time.perf_counter() - start
    ms = np.array(lat) * 1000
    return {
        "requests": len(lat),
        "errors": len(errors),
        "qps": round(len(lat) / elapsed, 1),
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p95_ms": round(float(np.percentile(ms, 95)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        **{
            f"server_{k}_ms": round(statistics.fmean(t[k] for t in server_ms), 3)
            for k in ("encode", "search", "rerank", "total")
        },
    }


def floors(root: Path, name: str, texts: list[str], threads: int) -> dict[str, float]:
    """In-process p50s: query encoding, ANN search (the served params), exact search, fusion of 128."""
    from model.runtime import load_encoder

    encoder = load_encoder(DEFAULT_MODEL_DIR, backend="onnx", threads=threads)
    index = fmt.IndexVersion.open(root, name)
    enc, ann, exact, fusion = [], [], [], []
    recall = []
    tokens = np.zeros((128, TOKENS, WIDTH), np.float32)
    for n, text in enumerate(texts[:200]):
        t0 = time.perf_counter()
        q = encoder.encode_text([text])
        t1 = time.perf_counter()
        _, rows = index.search(q.embeds, 10)
        t2 = time.perf_counter()
        enc.append(t1 - t0)
        ann.append(t2 - t1)
        if n < 40:
            t3 = time.perf_counter()
            _, exact_rows = index.search_exact(q.embeds, 10)
            exact.append(time.perf_counter() - t3)
            recall.append(len(set(rows[0]) & set(exact_rows[0])) / 10)
        if n < 20:
            t4 = time.perf_counter()
            encoder.score_pairs(q.row(0), tokens)
            fusion.append(time.perf_counter() - t4)
    index.close()
    p50 = lambda xs: round(float(np.median(xs)) * 1000, 3)  # noqa: E731
    return {
        "encode_p50_ms": p50(enc),
        "ann_p50_ms": p50(ann),
        "exact_p50_ms": p50(exact),
        "fusion128_p50_ms": p50(fusion),
        "ann_recall_at_10": round(float(np.mean(recall)), 3),
    }


def serve(root: Path, name: str, port: int, threads: int, workers: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCRK_")}
    env.update(
        {
            "CCRK_THREADS": str(threads),
            "CCRK_CACHE_SIZE": "0",
            "CCRK_SEARCH_WORKERS": str(workers),
            "CCRK_INDEX_POLL_S": "3600",
        }
    )
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "ccrk"),
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
        cwd=REPO,
    )
    import httpx

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the service did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, action="append", help="index sizes (repeatable); default 100000")
    parser.add_argument("--root", type=Path, default=REPO / "artifacts" / "bench-indexes")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--rerank", default="off,on", help="re-rank settings to run: off, on or off,on")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads in the service")
    parser.add_argument("--workers", type=int, default=2, help="CCRK_SEARCH_WORKERS of the service")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    texts = queries()
    rows = []
    for n in args.items or [100_000]:
        name = build_index(args.root, n)
        floor = floors(args.root, name, texts, args.threads)
        proc = serve(args.root, name, args.port, args.threads, args.workers)
        try:
            for rerank in (r.strip() == "on" for r in args.rerank.split(",")):
                bodies = [
                    json.dumps({"query": t, "top_k": 10, "rerank": rerank, "rerank_k": 128}).encode()
                    for t in texts
                ]
                for c in (int(x) for x in args.concurrency.split(",")):
                    result = asyncio.run(run_load(args.port, bodies, c, args.seconds))
                    row = {
                        "items": n,
                        "rerank": rerank,
                        "concurrency": c,
                        **result,
                        "targets": TARGETS.get((c, rerank), {}),
                        **floor,
                    }
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "threads": args.threads,
        "workers": args.workers,
        "seconds_per_point": args.seconds,
        "rows": rows,
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        "\n| items | rerank | conc. | p50 ms | p95 ms | p99 ms | q/s "
        "| server encode / search / rerank / total ms | targets | floor: encode / ANN / exact ms |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        targets = ", ".join(f"{k} ≤ {v}" if k != "qps" else f"q/s ≥ {v}" for k, v in r["targets"].items())
        print(
            f"| {r['items']:,} | {'on' if r['rerank'] else 'off'} | {r['concurrency']} | {r['p50_ms']} | "
            f"{r['p95_ms']} | {r['p99_ms']} | {r['qps']} | "
            f"{r['server_encode_ms']} / {r['server_search_ms']} / {r['server_rerank_ms']} / "
            f"{r['server_total_ms']} | {targets or '-'} | "
            f"{r['encode_p50_ms']} / {r['ann_p50_ms']} / {r['exact_p50_ms']} |"
        )


if __name__ == "__main__":
    main()
