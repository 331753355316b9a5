"""Indexer benchmark: build throughput on images, and the chosen ANN index on synthetic vectors.

    python bench/index_throughput.py                               # everything, default sizes
    python bench/index_throughput.py --skip-images --vector-sizes 100000

Measures (not a test; prints a JSON document, then a table; ``--out`` also writes the JSON):
- items/s of a full ``ccrk index build`` (decode workers, encoder, shards, index, tuning, publish) of the
  real photos in ``../shared/data/photos`` (skipped with a reason when absent) and of ``--catalogue-items``
  synthetic catalogue items, next to the decode-only ceiling (the same decode pool without the model);
- for each of ``--vector-sizes`` synthetic vectors of dim ``--dim`` (clustered, like real embeddings; a
  uniform random cloud has no neighbourhood structure): the index type the indexer chooses under the
  default settings, its build time, bytes per item, recall@10 against exact search on held-out queries
  after tuning, and single-query latency on one thread, next to exact search's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import faiss  # noqa: E402

from ccrk_settings import Settings  # noqa: E402
from indexer.ann import build_faiss_index, choose_index, recall_at, tune_search_params  # noqa: E402
from store.layout import BUILDS_DIR, EMBEDDINGS_FILE, FORMAT_VERSION, INDEX_FILE, METADATA_FILE  # noqa: E402
from store.version.manifest import IndexManifest  # noqa: E402
from store.version.metadata import write_metadata  # noqa: E402
from store.version.reader import IndexVersion  # noqa: E402


def _settings(args: argparse.Namespace, root: Path) -> Settings:
    return Settings(
        index_root=root, threads=args.threads, index_workers=args.workers, backend="onnx", device=args.device
    )


def bench_build(
    label: str, sources: list[Path], paths: list[str], args: argparse.Namespace, tmp: Path
) -> dict:
    """A full build of ``sources`` and the decode-only ceiling over the same files."""
    from indexer.build import build
    from indexer.decode import DecodePool, Decoder
    from model.model_dir import load_model_config
    from model.runtime import load_encoder

    settings = _settings(args, tmp / f"idx-{label}")
    cfg = load_model_config(settings.model_dir)
    # Decode-only first (also warms the page cache, so neither run pays the disk alone).
    start = time.perf_counter()
    sample: list[np.ndarray] = []
    decoded = 0
    with DecodePool(Decoder(cfg.vision, settings.max_image_pixels), settings.index_workers) as pool:
        for pixels, _, _ in pool.map(paths):
            if pixels is not None:
                decoded += 1
                if len(sample) < 512:
                    sample.append(pixels)
    decode_s = time.perf_counter() - start
    # Encoder-only ceiling on already decoded pixels, same threads and batch size: on a shared machine
    # it shows how much of the build's speed the model alone allows at this moment.
    encoder = load_encoder(settings.model_dir, settings.backend, settings.device, settings.threads)
    batch = settings.index_batch_size
    pixels_all = np.stack(sample)
    encoder.encode_images(pixels_all[:batch])
    start = time.perf_counter()
    for i in range(0, len(pixels_all), batch):
        encoder.encode_images(pixels_all[i : i + batch])
    encode_only_ips = len(pixels_all) / (time.perf_counter() - start)
    del encoder
    start = time.perf_counter()
    report = build(label, sources, settings=settings)
    total_s = time.perf_counter() - start
    decode_ips = len(paths) / decode_s
    return {
        "items": len(paths),
        "decoded_ok": decoded,
        "indexed": report.count,
        "skipped": len(report.skipped),
        "encode_items_per_s": round(report.items_per_second, 1),
        "end_to_end_items_per_s": round(len(paths) / total_s, 1),
        "end_to_end_s": round(total_s, 2),
        "decode_only_items_per_s": round(decode_ips, 1),
        "ratio_to_decode_only": round(report.items_per_second / decode_ips, 3),
        "encoder_only_items_per_s": round(encode_only_ips, 1),
        "ratio_to_encoder_only": round(report.items_per_second / encode_only_ips, 3),
        "index_factory": report.index_factory,
        "rerank_bytes_per_image": report.rerank_bytes_per_image,
        "language_recall_at_10": report.language_recall_at_10,
    }


def clustered_vectors(
    n: int, d: int, seed: int, centres: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """Unit vectors around random centres (intra-cluster cosine ~0.5), written in chunks."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, d), dtype=np.float32) if out is None else out
    for start in range(0, n, 100_000):
        m = min(100_000, n - start)
        x = centres[rng.integers(0, len(centres), m)] + rng.normal(0, 1.0 / np.sqrt(d), (m, d)).astype(
            np.float32
        )
        out[start : start + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def _latency_ms(fn: Any, queries: np.ndarray) -> tuple[float, float]:
    for i in range(min(20, len(queries))):
        fn(queries[i : i + 1])  # warm-up: page cache, allocations
    times = []
    for i in range(len(queries)):
        t = time.perf_counter()
        fn(queries[i : i + 1])
        times.append(time.perf_counter() - t)
    arr = np.asarray(times) * 1000
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99))


def bench_vectors(n: int, d: int, args: argparse.Namespace, tmp: Path) -> dict:
    """The indexer's own choice, build, tuning and search path on ``n`` synthetic vectors."""
    defaults = Settings()
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(max(64, n // 250), d)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    stage = tmp / f"vec-{n}" / BUILDS_DIR / "stage"
    stage.mkdir(parents=True)
    emb = np.lib.format.open_memmap(stage / EMBEDDINGS_FILE, mode="w+", dtype=np.float32, shape=(n, d))
    clustered_vectors(n, d, 1, centres, emb)
    emb.flush()
    tune_q = clustered_vectors(1000, d, 2, centres)
    test_q = clustered_vectors(args.queries, d, 3, centres)
    plan = choose_index(
        n, d, exact_max_items=defaults.exact_max_items, memory_budget_mb=defaults.memory_budget_mb,
        factory=args.index_factory,
    )  # fmt: skip
    faiss.omp_set_num_threads(args.build_threads)
    start = time.perf_counter()
    index, notes = build_faiss_index(emb, plan)
    build_s = time.perf_counter() - start
    faiss.write_index(index, str(stage / INDEX_FILE))
    del index
    write_metadata(stage / METADATA_FILE, ((i, str(i), None, {}, False) for i in range(n)))
    manifest = IndexManifest(
        format_version=FORMAT_VERSION, name=f"vec-{n}", version="20000101T000000Z-000000",
        created_at="", model_name="synthetic", model_fingerprint="-", embed_dim=d, preprocessing={},
        count=n, index_factory=plan.factory, search_params={}, measured_recall_at_10=None,
        language_recall_at_10={}, build_seconds=build_s, skipped=[], checksums={},
        rerank={"dtype": "none", "tokens": 0, "width": 0, "bytes_per_image": 0}, parent_version=None,
        total_rows=n,
    )  # fmt: skip
    with IndexVersion(stage, manifest) as idx:
        start = time.perf_counter()
        params, tuned_recall = tune_search_params(
            idx, tune_q, target=defaults.target_recall, rescore_factor=plan.rescore_factor
        )
        tune_s = time.perf_counter() - start
        _, exact = idx.search_exact(test_q, 10)
        faiss.omp_set_num_threads(1)
        _, ann = idx.search(test_q, 10)
        recall = recall_at(ann, exact, 10)
        ann_p50, ann_p99 = _latency_ms(lambda q: idx.search(q, 10), test_q)
        flat = faiss.IndexFlatIP(d)
        flat.add(np.asarray(emb))
        exact_q = test_q[: args.exact_queries]
        flat_p50, flat_p99 = _latency_ms(lambda q: flat.search(q, 10), exact_q)
    index_bytes = (stage / INDEX_FILE).stat().st_size
    shutil.rmtree(stage.parent.parent, ignore_errors=True)
    return {
        "n": n,
        "dim": d,
        "index_factory": plan.factory,
        "build_params": {**plan.build_params, **notes},
        "build_threads": args.build_threads,
        "build_s": round(build_s, 2),
        "tune_s": round(tune_s, 2),
        "search_params": params,
        "index_bytes_per_item": round(index_bytes / n, 1),
        "embeddings_bytes_per_item": 4 * d,
        "recall_at_10_tuning_queries": round(tuned_recall, 4),
        "recall_at_10_test_queries": round(recall, 4),
        "test_queries": len(test_q),
        "ann_single_query_ms_p50": round(ann_p50, 3),
        "ann_single_query_ms_p99": round(ann_p99, 3),
        "exact_faiss_flat_single_query_ms_p50": round(flat_p50, 3),
        "exact_faiss_flat_single_query_ms_p99": round(flat_p99, 3),
        "speedup_vs_exact_p50": round(flat_p50 / ann_p50, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--photos", type=Path, default=ROOT.parent / "shared" / "data" / "photos")
    parser.add_argument("--catalogue-items", type=int, default=10_000)
    parser.add_argument("--skip-images", action="store_true")
    parser.add_argument("--vector-sizes", default="100000,1000000", help="Comma-separated; empty to skip.")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--index-factory", default=None, help="Override the automatic choice (vectors).")
    parser.add_argument("--queries", type=int, default=1000, help="Held-out test queries (vectors).")
    parser.add_argument("--exact-queries", type=int, default=100, help="Queries timed for exact search.")
    parser.add_argument("--threads", type=int, default=2, help="Encoder threads (image builds).")
    parser.add_argument("--workers", type=int, default=2, help="Decode worker processes (image builds).")
    parser.add_argument("--build-threads", type=int, default=os.cpu_count() or 1, help="faiss build threads.")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "faiss": faiss.__version__,
                    "gpus": faiss.get_num_gpus()},
        "settings": {"threads": args.threads, "workers": args.workers},
        "builds": {},
        "vectors": [],
        "skipped": [],
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="ccrk-index-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if not args.skip_images:
            if args.photos.is_dir():
                photos = sorted(
                    str(p) for p in args.photos.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png")
                )
                results["builds"]["photos"] = bench_build("photos", [args.photos], photos, args, tmp)
            else:
                results["skipped"].append(f"photos: {args.photos} not found (shared data absent)")
            if args.catalogue_items > 0:
                from synthetic.synth import SynthConfig, generate_catalogue

                cat = tmp / "catalogue"
                generate_catalogue(cat, SynthConfig(seed=0, n_train=0, n_val=0, n_test=args.catalogue_items))
                paths = [str(p) for p in sorted((cat / "images" / "test").iterdir())]
                results["builds"]["catalogue"] = bench_build(
                    "catalogue", [cat / "test.jsonl"], paths, args, tmp
                )
        for size in [int(s) for s in args.vector_sizes.split(",") if s.strip()]:
            results["vectors"].append(bench_vectors(size, args.dim, args, tmp))
            print(json.dumps(results["vectors"][-1]), file=sys.stderr, flush=True)

    text = json.dumps(results, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    if results["builds"]:
        print(
            "\n| collection | items | indexed | encode items/s | end-to-end items/s | decode-only items/s "
            "| ratio | encoder-only items/s | ratio |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, b in results["builds"].items():
            print(
                f"| {name} | {b['items']:,} | {b['indexed']:,} | {b['encode_items_per_s']:,.1f} | "
                f"{b['end_to_end_items_per_s']:,.1f} | {b['decode_only_items_per_s']:,.1f} | "
                f"{b['ratio_to_decode_only']:.2f} | {b['encoder_only_items_per_s']:,.1f} | "
                f"{b['ratio_to_encoder_only']:.2f} |"
            )
    if results["vectors"]:
        print(
            "\n| vectors | index | params | build s | index bytes/item | recall@10 | ANN ms p50 / p99 "
            "| exact ms p50 | speed-up |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for v in results["vectors"]:
            print(
                f"| {v['n']:,} x {v['dim']} | {v['index_factory']} | {json.dumps(v['search_params'])} | "
                f"{v['build_s']:.1f} | {v['index_bytes_per_item']:,.0f} | "
                f"{v['recall_at_10_test_queries']:.4f} | "
                f"{v['ann_single_query_ms_p50']:.3f} / {v['ann_single_query_ms_p99']:.3f} | "
                f"{v['exact_faiss_flat_single_query_ms_p50']:.2f} | {v['speedup_vs_exact_p50']:.0f}x |"
            )
    for s in results["skipped"]:
        print(f"skipped: {s}")


if __name__ == "__main__":
    main()
