"""The starter model on real photos: per-language recall, MRV, and what it costs.

    python bench/starter_real_photos.py --out bench/results/starter_real_photos-DATE.json
    python bench/starter_real_photos.py --model DIR           # an existing `ccrk model build-starter` output

Builds the starter model (unless ``--model``), indexes the 1,000 shared real photos with the indexer
(``indexer.build.build``, as ``ccrk index build`` does), then searches every class name in en (from the file
names) and de/fr/es/ja/zh (Babel-ImageNet) against the index, one query at a time. Chance: R@1 0.1 %,
R@10 1 %. Prints a JSON document, then a table; not a test. Needs ``../shared/data`` (see
``bench/real_photos.py``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.real_photos import PHOTOS, RealQueries, load_real_queries, missing_reason  # noqa: E402
from ccrk_settings import Settings  # noqa: E402
from indexer.build import build  # noqa: E402
from model.metrics import mrv, mrv_std  # noqa: E402
from model.runtime import load_encoder  # noqa: E402
from store.version.reader import IndexVersion  # noqa: E402

KS = (1, 5, 10)


def per_language(index: IndexVersion, encoder: object, queries: RealQueries, depth: int) -> dict:
    """Recall@k per language, the 0-based rank of every class's photo, and query latencies."""
    row_of = {item["id"]: row for row, item in enumerate(index.items(list(range(len(index)))))}
    out: dict[str, dict] = {}
    ranks_by_lang: dict[str, dict[int, int]] = {}
    encode_ms: list[float] = []
    search_ms: list[float] = []
    for lang, pairs in queries.by_language.items():
        ranks: dict[int, int] = {}
        for cls, name in pairs:
            t0 = time.perf_counter()
            embeds = encoder.encode_text([name]).embeds  # type: ignore[attr-defined]
            t1 = time.perf_counter()
            _, rows = index.search(embeds, depth)
            search_ms.append((time.perf_counter() - t1) * 1000.0)
            encode_ms.append((t1 - t0) * 1000.0)
            hit = np.flatnonzero(rows[0] == row_of[queries.photo_ids[cls]])
            ranks[cls] = int(hit[0]) if hit.size else depth
        ranks_by_lang[lang] = ranks
        values = np.fromiter(ranks.values(), dtype=np.int64)
        out[lang] = {
            "queries": len(values),
            **{f"R@{k}": round(100.0 * float((values < k).mean()), 2) for k in KS},
        }
    return {"recall": out, "ranks": ranks_by_lang, "encode_ms": encode_ms, "search_ms": search_ms}


def consistency(queries: RealQueries, ranks: dict[str, dict[int, int]], languages: tuple[str, ...]) -> dict:
    common = queries.common_classes(languages)
    table = np.asarray([[ranks[lang][c] for lang in languages] for c in common], dtype=np.float64)
    return {
        "languages": list(languages),
        "classes": len(common),
        "mrv": mrv(table),
        "mrv_std": mrv_std(table),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="A starter model directory (default: build one).")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="Indexer decode processes.")
    parser.add_argument(
        "--depth", type=int, default=1000, help="Results searched per query (ranks past it clip)."
    )
    parser.add_argument("--out", type=Path, help="Also write the JSON here.")
    args = parser.parse_args()
    reason = missing_reason()
    if reason:
        print(json.dumps({"skipped": reason}))
        return 0
    queries = load_real_queries()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model_dir = args.model
        build_s = None
        if model_dir is None:
            from model.starter.build import build_starter

            t0 = time.perf_counter()
            model_dir = build_starter(tmp / "starter").out
            build_s = round(time.perf_counter() - t0, 1)
        settings = Settings(index_root=tmp / "indexes", threads=args.threads, index_workers=args.workers)
        report = build("photos", [PHOTOS], settings=settings, model_dir=model_dir)
        encoder = load_encoder(model_dir, threads=1)
        with IndexVersion.open(settings.index_root, "photos") as index:
            measured = per_language(index, encoder, queries, min(args.depth, len(index)))
    result = {
        "benchmark": "starter_real_photos",
        "machine": {"cpus": __import__("os").cpu_count(), "platform": platform.platform()},
        "model": str(args.model or "built by ccrk model build-starter"),
        "starter_build_seconds": build_s,
        "index": {
            "items": report.items_indexed,
            "encode_seconds": round(report.encode_seconds, 2),
            "images_per_second": round(report.items_indexed / report.encode_seconds, 1),
            "threads": args.threads,
            "decode_workers": args.workers,
        },
        "recall": measured["recall"],
        "mean_recall_non_english": {
            f"R@{k}": round(
                float(np.mean([v[f"R@{k}"] for lang, v in measured["recall"].items() if lang != "en"])), 2
            )
            for k in KS
        },
        "consistency_all": consistency(
            queries, measured["ranks"], ("en", *sorted(set(measured["ranks"]) - {"en"}))
        ),
        "consistency_de_ja_zh": consistency(queries, measured["ranks"], ("de", "ja", "zh")),
        "query_ms": {
            "encode_p50": round(float(np.median(measured["encode_ms"])), 3),
            "encode_p99": round(float(np.percentile(measured["encode_ms"], 99)), 3),
            "search_p50": round(float(np.median(measured["search_ms"])), 3),
            "threads": 1,
        },
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(f"\n{'lang':<6}{'queries':>9}{'R@1':>8}{'R@5':>8}{'R@10':>8}")
    for lang, row in result["recall"].items():
        print(f"{lang:<6}{row['queries']:>9}{row['R@1']:>8.1f}{row['R@5']:>8.1f}{row['R@10']:>8.1f}")
    c = result["consistency_all"]
    named = ", ".join(c["languages"])
    print(f"MRV over {c['classes']} classes named in {named}: {c['mrv']:.1f} (mrv_std {c['mrv_std']:.2f})")
    speed, encode = result["index"]["images_per_second"], result["query_ms"]["encode_p50"]
    print(f"index: {speed} images/s; query encode p50 {encode} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
