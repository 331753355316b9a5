"""Incremental rebuilds: what ``ccrk index build`` costs when little changed (``indexer.incremental``).

    python bench/incremental.py --out bench/results/incremental-DATE.json
    python bench/incremental.py --synthetic-items 0          # the shared photos only

Measures (not a test; prints a JSON document, then a table; ``--out`` also writes the JSON, with the
command line under "command"), each as wall time of ``indexer.build.build`` (what the CLI runs) and items
encoded / reused:

- the shared photos (``../shared/data/photos``, 1,000 real JPEGs; skipped with a reason when absent) as a
  manifest with a price per row, copied to a temp folder: a full build; a rebuild with nothing changed
  (already CURRENT) and with every file touched (same bytes, new mtimes); 1 % of the images changed
  (re-saved mirrored); 1 % added and 1 % removed; a metadata-only change of every row; then a ``--force``
  build of the same manifest, whose answers the incremental version's must equal (ids, scores within
  1e-6); disk used by two versions that share their arrays (hard links) and by two that do not.
- ``--synthetic-items`` (100,000) items whose first version is written with synthetic vectors (clustered
  unit embeddings, random re-rank tokens of the model's real shape) over tiny placeholder files (their
  bytes are what the content digests cover; nothing decodes them), published through the store's writer
  with the digests a build writes; then the same scenarios, where the changed and added items are real
  photos (really encoded), and last 1 % of rows appended (the HNSW graph extended or rebuilt, as
  measured). The full build's time at this size is projected: the synthetic version's write time plus
  encoding at the rate measured on the real photos.
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

from PIL import Image, ImageOps  # noqa: E402

from ccrk_settings import DEFAULT_MODEL_DIR, Settings  # noqa: E402
from indexer.build import build  # noqa: E402
from indexer.build_key import BUILD_KEY  # noqa: E402
from indexer.incremental import digest_and_stat  # noqa: E402
from indexer.pipeline import rerank_info, utc_now, write_ann_index  # noqa: E402
from indexer.report import BuildReport  # noqa: E402
from indexer.sources import read_sources  # noqa: E402
from indexer.tuning import tune_staged  # noqa: E402
from model.model_dir import load_model_config  # noqa: E402
from store.files import disk_bytes  # noqa: E402
from store.layout import FORMAT_VERSION, index_dir  # noqa: E402
from store.opening import open_version  # noqa: E402
from store.version.manifest import IndexManifest, model_fingerprint, model_name_of  # noqa: E402
from store.version.reuse import RACY_NS, REUSE_KEY, reuse_key, row_digests, write_reuse_digests  # noqa: E402
from store.version.versions import current_version  # noqa: E402
from store.version.writer import VersionWriter  # noqa: E402

NAME = "shop"


def _settings(args: argparse.Namespace, root: Path) -> Settings:
    return Settings(
        index_root=root,
        model_dir=args.model,
        threads=args.threads,
        index_workers=args.workers,
        backend="onnx",
        device="cpu",
        keep_versions=10,
    )


def _write_manifest(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _mirror(src: Path, dst: Path) -> None:
    """Other bytes, a real photo: the image mirrored, saved as JPEG."""
    with Image.open(src) as im:
        ImageOps.mirror(im.convert("RGB")).save(dst, format="JPEG", quality=90)


def _run(label: str, manifest: Path, settings: Settings, *, force: bool = False) -> dict[str, Any]:
    # Files changed within the last 2 s are hashed whatever their stats say
    # (``store.version.reuse.RACY_NS``); a
    # nightly rebuild finds its changes hours old: wait that out, untimed.
    time.sleep(RACY_NS / 1e9 + 0.1)
    start = time.perf_counter()
    report = build(NAME, [manifest], settings=settings, force=force)
    seconds = time.perf_counter() - start
    out = {
        "scenario": label,
        "seconds": round(seconds, 3),
        "items": report.items_total,
        "items_encoded": report.items_encoded,
        "items_reused": report.items_reused,
        "new": report.items_new,
        "changed": report.items_changed,
        "removed": report.items_removed,
        "published": report.published,
        "already_current": report.already_current,
        "encode_seconds": round(report.encode_seconds, 3),
        "ann_index": report.ann_index,
        "segments": report.index_shards,
        "notes": [n for n in report.notes if n.startswith(("compacted", "recall, match"))],
        "index_factory": report.index_factory,
        "version": report.version,
    }
    print(json.dumps(out), file=sys.stderr, flush=True)
    return out


def _same_answers(settings: Settings, a: str, b: str, queries: int = 200) -> dict[str, Any]:
    """The two versions' top 10 for ``queries`` of their own stored embeddings (perturbed), by exact
    search (a segmented version and one index of the same items must agree exactly) and by each one's ANN
    search: ids equal, largest score difference."""
    with open_version(settings.index_root, NAME, a) as va, open_version(settings.index_root, NAME, b) as vb:
        rng = np.random.default_rng(0)
        rows = rng.choice(vb.total_rows, size=min(queries, vb.total_rows), replace=False)
        q = vb.embeddings(rows) + rng.normal(0, 0.05, (rows.size, vb.manifest.embed_dim)).astype(np.float32)
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        out: dict[str, Any] = {"queries": int(rows.size), "layout": [type(va).__name__, type(vb).__name__]}
        for how in ("search_exact", "search"):
            sa, ra = getattr(va, how)(q, 10)
            sb, rb = getattr(vb, how)(q, 10)
            ids_a = [[it["id"] for it in va.items(r)] for r in ra]
            ids_b = [[it["id"] for it in vb.items(r)] for r in rb]
            out[how] = {"ids_equal": ids_a == ids_b, "max_score_diff": float(np.abs(sa - sb).max())}
        return out


def _scenarios(
    shop: Path,
    rows: list[dict[str, Any]],
    spare: list[Path],
    settings: Settings,
    full: dict[str, Any],
    *,
    force: bool = True,
    append: bool = False,
) -> dict[str, Any]:
    """The rebuild scenarios after a full build of ``rows`` (published as ``full``); ``spare``: real photos
    for the changed and added items; ``force``: a ``--force`` build last, compared with the incremental
    version (not on placeholder files, which do not decode); ``append``: then 1 % of rows appended."""
    manifest = shop / "catalogue.jsonl"
    n = len(rows)
    one = max(1, n // 100)
    results = [full]
    results.append(_run("nothing changed", manifest, settings))
    for r in rows:
        os.utime(shop / r["path"])
    results.append(_run("nothing changed, files touched", manifest, settings))
    rng = np.random.default_rng(1)
    for i in rng.choice(n, size=one, replace=False):
        target = shop / rows[int(i)]["path"]
        real = spare[int(i) % len(spare)]
        _mirror(real, target)
    results.append(_run("1% images changed", manifest, settings))
    changed_version = results[-1]["version"]
    drop = set(rng.choice(n, size=one, replace=False).tolist())
    kept = [r for i, r in enumerate(rows) if i not in drop]
    added = []
    for k in range(one):
        dst = shop / "added" / f"added-{k:06d}.jpg"
        dst.parent.mkdir(exist_ok=True)
        with Image.open(spare[(k * 7 + 3) % len(spare)]) as im:
            ImageOps.flip(im.convert("RGB")).save(dst, format="JPEG", quality=90)
        added.append({"id": f"added-{k:06d}", "path": str(dst.relative_to(shop)), "price": 1.0})
    rows[:] = kept + added
    _write_manifest(manifest, rows)
    results.append(_run("1% added + 1% removed", manifest, settings))
    added_version = results[-1]["version"]
    for r in rows:
        r["price"] = round(float(r["price"]) * 1.1 + 0.01, 2)
    _write_manifest(manifest, rows)
    results.append(_run("metadata-only change of every row", manifest, settings))
    meta_version = results[-1]["version"]
    if append:  # rows only appended: an HNSW graph is extended when recall allows (the choice is reported)
        for k in range(one):
            dst = shop / "appended" / f"appended-{k:06d}.jpg"
            dst.parent.mkdir(exist_ok=True)
            with Image.open(spare[(k * 11 + 5) % len(spare)]) as im:
                im.convert("RGB").rotate(90, expand=True).save(dst, format="JPEG", quality=90)
            rows.append({"id": f"appended-{k:06d}", "path": str(dst.relative_to(shop)), "price": 2.0})
        _write_manifest(manifest, rows)
        results.append(_run("1% appended", manifest, settings))
    base = index_dir(settings.index_root, NAME)
    one_version = disk_bytes(base / full["version"])
    disk = {
        "one_version_bytes": one_version,
        # the full build's version and the one with 1 % of images changed (99 % of items the same)
        "two_versions_99pct_same_items_bytes": disk_bytes(base / full["version"], base / changed_version),
        # that one and the next (1 % added + 1 % removed), and the metadata-only one after it
        "changed_and_added_bytes": disk_bytes(base / changed_version, base / added_version),
        "added_and_metadata_only_bytes": disk_bytes(base / added_version, base / meta_version),
    }
    disk["ratio_99pct_same_items"] = round(disk["two_versions_99pct_same_items_bytes"] / one_version, 3)
    disk["ratio_changed_and_added"] = round(disk["changed_and_added_bytes"] / one_version, 3)
    disk["ratio_added_and_metadata_only"] = round(disk["added_and_metadata_only_bytes"] / one_version, 3)
    equal: dict[str, Any] = {}
    if force:
        results.append(_run("--force (reference)", manifest, settings, force=True))
        equal = _same_answers(settings, meta_version, results[-1]["version"])
    for r in results:
        r["share_of_full_build_time"] = round(r["seconds"] / full["seconds"], 4)
    return {"items": n, "scenarios": results, "disk": disk, "incremental_vs_force": equal}


def bench_photos(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    photos = sorted(p for p in args.photos.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    shop = tmp / "photos-shop"
    (shop / "images").mkdir(parents=True)
    rows = []
    for i, p in enumerate(photos):
        shutil.copy2(p, shop / "images" / p.name)
        rows.append({"id": p.stem, "path": f"images/{p.name}", "price": float(i % 50) + 0.99})
    manifest = _write_manifest(shop / "catalogue.jsonl", rows)
    settings = _settings(args, tmp / "idx-photos")
    full = _run("full build", manifest, settings)
    out = _scenarios(shop, rows, photos, settings, full)
    out["encode_items_per_s"] = round(full["items_encoded"] / max(full["encode_seconds"], 1e-9), 1)
    return out


def _synthetic_version(n: int, shop: Path, settings: Settings, rows: list[dict[str, Any]]) -> float:
    """Publish version 1 of ``n`` placeholder items with synthetic vectors, as a build would store them
    (digests included); returns the seconds it took."""
    time.sleep(RACY_NS / 1e9 + 0.1)  # the placeholders were just written (see ``_run``); untimed
    start = time.perf_counter()
    model_dir = Path(settings.model_dir)
    cfg = load_model_config(model_dir)
    d = cfg.embed_dim
    fingerprint = model_fingerprint(model_dir)
    items = read_sources([shop / "catalogue.jsonl"]).items
    images, stats = digest_and_stat(items)
    from indexer.disk import token_shape
    from model.runtime import load_encoder

    encoder = load_encoder(model_dir, backend="onnx", threads=1)
    tokens, width = token_shape(encoder, cfg.vision.image_size)
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(max(64, n // 250), d)).astype(np.float32)
    with VersionWriter(settings.index_root, NAME) as writer:
        checksums = np.zeros((n, 16), np.uint8)
        with writer.arrays(n, d, tokens=tokens, width=width, rerank_dtype="fp16") as arrays:
            for lo in range(0, n, 4096):
                m = min(4096, n - lo)
                emb = centres[rng.integers(len(centres), size=m)] + rng.normal(0, 0.3, (m, d)).astype(
                    np.float32
                )
                emb /= np.linalg.norm(emb, axis=1, keepdims=True)
                tok = rng.standard_normal((m, tokens, width), dtype=np.float32).astype(np.float16)
                arrays.append(emb, tok)
                checksums[lo : lo + m] = row_digests(emb, tok, None)
        write_reuse_digests(writer.stage, images, checksums, stats)
        writer.write_metadata((i, it.id, str(it.path), it.fields, False) for i, it in enumerate(items))
        plan, notes = write_ann_index(
            writer, n, d, settings, None, memory_budget_mb=settings.memory_budget_mb
        )
        manifest = IndexManifest(
            format_version=FORMAT_VERSION, name=NAME, version=writer.version, created_at=utc_now(),
            model_name=model_name_of(model_dir), model_fingerprint=fingerprint, embed_dim=d,
            preprocessing={"image_size": cfg.vision.image_size, "mean": list(cfg.vision.mean),
                           "std": list(cfg.vision.std)},
            count=n, index_factory=plan.factory, search_params={}, measured_recall_at_10=None,
            language_recall_at_10={}, build_seconds=0.0, skipped=[], checksums={},
            rerank=rerank_info("fp16", tokens, width), parent_version=None, total_rows=n,
            build_params={
                **plan.build_params, **notes, BUILD_KEY: "synthetic",
                REUSE_KEY: reuse_key(
                    fingerprint=fingerprint, rerank_dtype=settings.rerank_dtype,
                    options=[settings.backend, settings.int8, settings.max_image_pixels],
                ),
            },
        )  # fmt: skip
        # Tuned and measured as a full build's version is (search parameters, recall, match calibration).
        tune_staged(writer, manifest, plan, encoder, [], settings, BuildReport("build", NAME, None, False))
        writer.finish(manifest, keep=settings.keep_versions)
    return time.perf_counter() - start


def bench_synthetic(n: int, args: argparse.Namespace, tmp: Path, encode_rate: float) -> dict[str, Any]:
    photos = sorted(p for p in args.photos.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    shop = tmp / "synthetic-shop"
    folder = shop / "images"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(2)
    rows = []
    for i in range(n):  # placeholders: only their bytes matter (nothing decodes an unchanged item)
        name = f"{i:07d}.jpg"
        (folder / name).write_bytes(rng.bytes(256))
        rows.append({"id": f"item-{i:07d}", "path": f"images/{name}", "price": float(i % 100)})
    _write_manifest(shop / "catalogue.jsonl", rows)
    settings = _settings(args, tmp / "idx-synthetic")
    written = _synthetic_version(n, shop, settings, rows)
    projected = written + n / encode_rate
    full = {
        "scenario": "full build (synthetic vectors; time projected)",
        "seconds": round(projected, 3),
        "synthetic_write_seconds": round(written, 3),
        "projected_encode_seconds": round(n / encode_rate, 3),
        "items": n,
        "items_encoded": n,
        "items_reused": 0,
        "version": current_version(settings.index_root, NAME),
    }
    return _scenarios(shop, rows, photos, settings, full, force=False, append=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--photos", type=Path, default=ROOT.parent / "shared" / "data" / "photos")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--synthetic-items", type=int, default=100_000, help="0 skips the synthetic set.")
    parser.add_argument("--threads", type=int, default=2, help="Encoder threads.")
    parser.add_argument("--workers", type=int, default=2, help="Decode worker processes.")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_before": os.getloadavg()},
        "model": str(args.model),
        "settings": {"threads": args.threads, "workers": args.workers},
        "sets": {},
        "skipped": [],
    }
    if not args.photos.is_dir():
        results["skipped"].append(f"{args.photos} not found (shared data absent): nothing measured")
    else:
        with tempfile.TemporaryDirectory(prefix="ccrk-incremental-") as tmp_name:
            tmp = Path(tmp_name)
            results["sets"]["photos"] = bench_photos(args, tmp)
            rate = results["sets"]["photos"]["encode_items_per_s"]
            if args.synthetic_items > 0:
                results["sets"][f"synthetic-{args.synthetic_items}"] = bench_synthetic(
                    args.synthetic_items, args, tmp, rate
                )
    results["machine"]["load_after"] = os.getloadavg()
    text = json.dumps(results, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    for name, res in results["sets"].items():
        print(f"\n{name}: {res['items']:,} items")
        print(
            "| scenario | seconds | share of full build | encoded | reused | new / changed / removed | ANN |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in res["scenarios"]:
            print(
                f"| {r['scenario']} | {r['seconds']:.2f} | {r['share_of_full_build_time']:.1%} | "
                f"{r['items_encoded']:,} | {r['items_reused']:,} | {r.get('new', '-')} / "
                f"{r.get('changed', '-')} / {r.get('removed', '-')} | {r.get('ann_index', '')} |"
            )
        disk, eq = res["disk"], res["incremental_vs_force"]
        print(
            f"disk: one version {disk['one_version_bytes']:,} B; with the 1 %-changed one "
            f"{disk['ratio_99pct_same_items']}x; 1 %-changed + 1 %-added/removed "
            f"{disk['ratio_changed_and_added']}x; that + metadata-only "
            f"{disk['ratio_added_and_metadata_only']}x"
        )
        if eq:
            for how in ("search_exact", "search"):
                print(
                    f"incremental vs --force ({how}): ids equal {eq[how]['ids_equal']}, max score diff "
                    f"{eq[how]['max_score_diff']:.2e} ({eq['queries']} queries)"
                )
    for s in results["skipped"]:
        print(f"skipped: {s}")


if __name__ == "__main__":
    main()
