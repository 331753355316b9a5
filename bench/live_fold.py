"""The fold of the live catalogue's pending changes into a version (issue 46): ``ccrk index compact`` of
N products with K pending changes (90 % patches of ``price`` / ``in_stock``, 10 % deletes of random
products), its time, and that the folded version answers as the version with the log did (the same rows
for a few filters, the same items and counts).

The version is written through ``store.version.writer.VersionWriter`` with synthetic vectors (a flat index:
a fold never reads vectors, it links them) and metadata ``category`` (40 values), ``price``, ``in_stock``;
the log is the embedded SQLite one.

    python bench/live_fold.py --products 100000 --changes 10000 --out bench/results/live-fold-DATE.json

Prints JSON and a table; not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import faiss
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ccrk_settings import Settings  # noqa: E402
from indexer.live_compact import compact  # noqa: E402
from store.layout import FORMAT_VERSION  # noqa: E402
from store.live import Change, Delete, Patch, SqliteChangeLog  # noqa: E402
from store.live.overlay import LiveOverlay  # noqa: E402
from store.live.view import LiveIndex  # noqa: E402
from store.opening import open_version  # noqa: E402
from store.version.manifest import IndexManifest  # noqa: E402
from store.version.writer import VersionWriter  # noqa: E402

D, T, W = 32, 2, 8
FILTERS: list[dict[str, Any]] = [
    {"in_stock": True},
    {"category": "category-7"},
    {"price": {"lt": 10}},
    {"category": ["category-1", "category-2"], "in_stock": False},
]


def write_version(root: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    embeds = rng.normal(size=(n, D)).astype(np.float32)
    embeds /= np.linalg.norm(embeds, axis=1, keepdims=True)
    with VersionWriter(root, "shop") as writer:
        index = faiss.IndexFlatIP(D)
        index.add(embeds)
        writer.write_index(index)
        writer.save_arrays(embeds, np.zeros((n, T, W), np.float16))
        writer.write_metadata(
            (
                i,
                f"sku-{i}",
                None,
                {"category": f"category-{i % 40}", "price": float(i % 500), "in_stock": i % 3 != 0},
                False,
            )
            for i in range(n)
        )
        manifest = IndexManifest(
            format_version=FORMAT_VERSION,
            name="shop",
            version=writer.version,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            model_name="bench",
            model_fingerprint="f" * 64,
            embed_dim=D,
            preprocessing={},
            count=n,
            index_factory="Flat",
            search_params={},
            measured_recall_at_10=None,
            language_recall_at_10={},
            build_seconds=0.0,
            skipped=[],
            checksums={},
            rerank={"dtype": "fp16", "tokens": T, "width": W, "bytes_per_image": T * W * 2},
            parent_version=None,
            total_rows=n,
        )
        writer.finish(manifest)


def changes(n: int, k: int, seed: int = 1) -> list[Change]:
    rng = random.Random(seed)
    out: list[Change] = []
    for _ in range(k):
        item = f"sku-{rng.randrange(n)}"
        if rng.random() < 0.1:
            out.append(Delete(item))
        else:
            out.append(
                Patch(item, fields={"price": round(rng.uniform(0, 500), 2), "in_stock": rng.random() < 0.6})
            )
    return out


def served_answers(root: Path) -> dict[str, Any]:
    """What a server shows: CURRENT with the log after what it holds applied."""
    base = open_version(root, "shop")
    index = LiveIndex(base, LiveOverlay(base, applied=base.manifest.live_sequence))
    with SqliteChangeLog.for_index(root, "shop") as log:
        index.overlay.apply(list(log.iter_changes(index.live_sequence)))
    sample = list(range(0, base.total_rows, max(1, base.total_rows // 2000)))
    out = {
        "count": len(index),
        "filters": [index.filter_rows(f).tolist() for f in FILTERS],
        "items": [
            it for r, it in zip(sample, index.items(sample), strict=True) if index.row_of(it["id"]) == r
        ],
    }
    base.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--products", type=int, default=100_000)
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load_before = list(os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="ccrk-live-fold-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        write_version(root, args.products)
        version_s = time.perf_counter() - t0
        with SqliteChangeLog.for_index(root, "shop") as log:
            batch = changes(args.products, args.changes)
            t0 = time.perf_counter()
            for start in range(0, len(batch), 1000):
                log.append(batch[start : start + 1000])
            append_s = time.perf_counter() - t0
        before = served_answers(root)
        t0 = time.perf_counter()
        report = compact("shop", settings=Settings(index_root=root))
        fold_s = time.perf_counter() - t0
        after = served_answers(root)
        with SqliteChangeLog.for_index(root, "shop") as log:
            pending = log.pending()
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/live_fold.py", *sys.argv[1:]]),
        "products": args.products,
        "changes": args.changes,
        "version_write_s": round(version_s, 2),
        "append_s": round(append_s, 2),
        "fold_s": round(fold_s, 2),
        "published": report.published,
        "notes": report.notes,
        "pending_after": pending,
        "same_answers": before == after,
        "loadavg_before": load_before,
        "loadavg_after": list(os.getloadavg()),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    print("\n| products | changes | fold (s) | pending after | same answers |\n|---|---|---|---|---|")
    print(f"| {args.products:,} | {args.changes:,} | {fold_s:.2f} | {pending} | {before == after} |")


if __name__ == "__main__":
    main()
