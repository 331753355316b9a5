"""What guarding a served version's files costs (issue 44, ``store.guard``), against the alternative of
copying its mapped arrays into memory at open.

Check per request (``--products``, default 20,000; what is checked is one syscall per file, whatever the
files' sizes): a version written through the store's own writer, with product channels as
``bench/products.py`` writes them (3 photos and 2 text values per product, flat channel indexes so that
writing it is quick), opened as the service opens it; ``damage()`` (what ``IndexHolder.lease`` asks before
every request) timed ``--calls`` times: p50 / p99 in microseconds, with a read lease on every file
(``F_GETLEASE`` each) and without (``fstat`` each, the fallback where no lease is granted); the number of
files checked. Against, for scale, the hybrid gather + fusion p50 at 100k products recorded in
``bench/results/products-cost-100k-2026-11-27-s15.json`` (0.695 ms).

Copy at open (the alternative that closes the window without leases): the bytes the mapped arrays of a
version of ``--copy-products`` products hold (main embeddings, 3 photos and 2 text values each at
``--dim``, the re-rank store at ``--rerank-bytes`` per item), which every serving process would hold again
in private memory instead of sharing the page cache; and the seconds to read them, from the measured rate
of reading a ``--copy-mb`` array from the page cache into memory (``np.load`` of a warm file).

    python bench/damage_guard.py --out bench/results/damage-guard-DATE.json

Prints JSON and a table; not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import faiss
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import store.guard
from store.layout import FORMAT_VERSION
from store.products.channels import PhotoRows, ProductInfo, TextRows, write_product_channels
from store.version.manifest import IndexManifest
from store.version.reader import IndexVersion
from store.version.writer import VersionWriter

HYBRID_P50_MS_100K = 0.695  # bench/results/products-cost-100k-2026-11-27-s15.json, hybrid_gather_and_fuse


def _unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def write_bench_version(root: Path, products: int, dim: int) -> str:
    rng = np.random.default_rng(0)
    embeds = _unit(rng, products, dim)
    tokens = rng.normal(size=(products, 4, 16)).astype(np.float16)
    owners = np.repeat(np.arange(products), 3).astype(np.int64)
    t_owners = np.repeat(np.arange(products), 2).astype(np.int64)
    vocab = [f"w{i}" for i in range(5000)]
    texts = [" ".join(vocab[w] for w in row) for row in rng.integers(0, len(vocab), size=(t_owners.size, 6))]
    with VersionWriter(root, "bench") as writer:
        index = faiss.IndexFlatIP(dim)
        index.add(embeds)
        writer.write_index(index)
        writer.save_arrays(embeds, tokens)
        writer.write_metadata((i, f"p{i}", f"p{i}.jpg", {"price": float(i)}, False) for i in range(products))
        info = ProductInfo(
            fields=["title"], text_languages=["en"], language_counts={"en": len(texts)}, photos=0, texts=0
        )
        write_product_channels(
            writer.stage,
            info,
            PhotoRows(owners, [f"p{i}" for i in range(owners.size)], _unit(rng, owners.size, dim)),
            TextRows(
                t_owners,
                ["title"] * len(texts),
                ["en"] * len(texts),
                texts,
                [t.split() for t in texts],
                _unit(rng, t_owners.size, dim),
            ),
            exact_max=10**9,  # flat channel indexes: the checked files are the same, the write is quick
        )
        manifest = IndexManifest(
            format_version=FORMAT_VERSION,
            name="bench",
            version=writer.version,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            model_name="bench",
            model_fingerprint="b" * 64,
            embed_dim=dim,
            preprocessing={},
            count=products,
            index_factory="Flat",
            search_params={},
            measured_recall_at_10=None,
            language_recall_at_10={},
            build_seconds=0.0,
            skipped=[],
            checksums={},
            rerank={},
            parent_version=None,
            total_rows=products,
        )
        return writer.finish(manifest).version


def time_checks(version: IndexVersion, calls: int) -> dict[str, Any]:
    assert version.damage() is None
    for _ in range(min(calls, 1000)):  # warm
        version.damage()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        version.damage()
        samples.append(time.perf_counter_ns() - t0)
    samples.sort()
    guards = [version._guard] + ([version.products._guard] if version.products is not None else [])
    return {
        "files": sum(len(g) for g in guards),
        "leased": sum(g.leased for g in guards),
        "p50_us": round(statistics.median(samples) / 1000, 2),
        "p99_us": round(samples[int(0.99 * (len(samples) - 1))] / 1000, 2),
    }


def copy_rate(work: Path, megabytes: int) -> float:
    """Bytes per second reading a warm ``.npy`` file into memory."""
    path = work / "copy.npy"
    np.save(path, np.ones(megabytes * (1 << 20) // 4, np.float32))
    np.load(path)  # warm the page cache
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        array = np.load(path)
        best = min(best, time.perf_counter() - t0)
        del array
    path.unlink()
    return megabytes * (1 << 20) / best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--products", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--copy-products", type=int, default=100_000)
    parser.add_argument("--rerank-bytes", type=int, default=49 * 256 * 2, help="re-rank store bytes per item")
    parser.add_argument("--copy-mb", type=int, default=512)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ccrk-damage-bench-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        write_bench_version(work, args.products, args.dim)
        written_s = time.perf_counter() - t0
        checks: dict[str, Any] = {}
        with IndexVersion.open(work, "bench") as version:
            checks["leases"] = time_checks(version, args.calls)
        taking = store.guard._take_lease
        store.guard._take_lease = lambda fd: False  # as where no lease is granted
        try:
            with IndexVersion.open(work, "bench") as version:
                checks["fstat"] = time_checks(version, args.calls)
        finally:
            store.guard._take_lease = taking
        rate = copy_rate(work, args.copy_mb)
    n, d = args.copy_products, args.dim
    mapped = {
        "embeddings": n * d * 4,
        "photo_embeddings": 3 * n * d * 4,
        "text_embeddings": 2 * n * d * 4,
        "rerank_tokens": n * args.rerank_bytes,
    }
    total = sum(mapped.values())
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python bench/damage_guard.py " + " ".join(sys.argv[1:]),
        "loadavg": Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None,
        "cpus": os.cpu_count(),
        "products_checked_version": args.products,
        "write_seconds": round(written_s, 1),
        "check_per_request": checks,
        "hybrid_p50_ms_100k_for_scale": HYBRID_P50_MS_100K,
        "check_share_of_hybrid_p50": round(checks["leases"]["p50_us"] / 1000 / HYBRID_P50_MS_100K, 4),
        "copy_at_open": {
            "products": n,
            "mapped_bytes": mapped,
            "total_gib": round(total / (1 << 30), 2),
            "read_rate_gib_s": round(rate / (1 << 30), 2),
            "seconds_per_open": round(total / rate, 2),
        },
    }
    print(json.dumps(result, indent=1))
    print()
    print(f"{'check per request':<28}{'files':>7}{'leased':>8}{'p50 us':>9}{'p99 us':>9}")
    for kind, row in checks.items():
        print(f"{kind:<28}{row['files']:>7}{row['leased']:>8}{row['p50_us']:>9}{row['p99_us']:>9}")
    copy = result["copy_at_open"]
    print(
        f"copy at open, {n} products: {copy['total_gib']} GiB private per process, "
        f"{copy['seconds_per_open']} s per open at {copy['read_rate_gib_s']} GiB/s"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
