"""Rebuilds of a product catalogue (``indexer.product_reuse``): what ``ccrk index build`` costs on the
grocery catalogue when nothing or little changed.

    python bench/products_rebuild.py --grocery ../shared/data/grocery \\
        --model artifacts/models/ccrk-starter --out bench/results/products-rebuild-DATE.json

The catalogue (``products.jsonl`` + ``img/``) is copied to a temp folder and built as ``bench/products.py``'s
quality run builds it (its manifest: ``--held-out`` shop photos per product left out; the four text fields;
2 threads, 2 decode workers). Wall time of ``indexer.build.build`` and what it encoded / reused, for:
a full build; a rebuild with nothing changed (already CURRENT); one with every file touched (same bytes,
new times: everything hashed again, nothing encoded); one after changing one product's title and one
further photo of another product (re-saved mirrored); then a ``--force`` build of that manifest (what every
rebuild of a product catalogue cost before issue 25's reuse reached products), whose channel vectors the
incremental one's must match (within 1e-5), and the touched rebuild's must equal the full build's bit for bit.
Not a test; prints the JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from PIL import Image, ImageOps  # noqa: E402

from ccrk_settings import Settings  # noqa: E402
from indexer.build import build  # noqa: E402
from indexer.report import BuildReport  # noqa: E402
from store.layout import index_dir  # noqa: E402
from store.products.channels import PHOTO_EMBEDDINGS, PHOTO_VISUAL, TEXT_EMBEDDINGS  # noqa: E402


def _bench_products() -> Any:
    spec = importlib.util.spec_from_file_location("bench_products", REPO / "bench" / "products.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(label: str, fn: Any) -> tuple[dict[str, Any], BuildReport]:
    started = time.perf_counter()
    report = fn()
    seconds = time.perf_counter() - started
    row = {
        "run": label,
        "seconds": round(seconds, 2),
        "already_current": report.already_current,
        "items_encoded": report.items_encoded,
        "items_reused": report.items_reused,
        "photos_encoded": report.photos_encoded,
        "photos_reused": report.photos_reused,
        "texts_encoded": report.texts_encoded,
        "texts_reused": report.texts_reused,
        "encode_seconds": round(report.encode_seconds, 2),
    }
    print(json.dumps(row), flush=True)
    return row, report


def _channels(root: Path, version: str | None) -> dict[str, np.ndarray]:
    assert version is not None
    folder = index_dir(root, "grocery") / version
    names = (PHOTO_EMBEDDINGS, PHOTO_VISUAL, TEXT_EMBEDDINGS)
    return {n: np.load(folder / n) for n in names if (folder / n).is_file()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grocery", type=Path, default=REPO.parent / "shared" / "data" / "grocery")
    parser.add_argument("--model", type=Path, default=REPO / "artifacts" / "models" / "ccrk-starter")
    parser.add_argument("--held-out", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    bench = _bench_products()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ccrk-products-rebuild-") as tmp:
        work = Path(tmp)
        shop = work / "grocery"
        shutil.copytree(args.grocery.resolve() / "img", shop / "img")
        shutil.copy2(args.grocery.resolve() / "products.jsonl", shop / "products.jsonl")
        manifest, _, _ = bench._manifest(shop, work, args.held_out)
        settings = Settings(
            model_dir=args.model.resolve(),
            index_root=work / "indexes",
            threads=2,
            index_workers=2,
            text_fields=bench.TEXT_FIELDS,
            index_name="grocery",
            rerank=False,
            redis_url=None,
            history_db=work / "history.sqlite",
            keep_versions=10,  # every version stays, to be compared
        )
        rows = [json.loads(line) for line in manifest.read_text().splitlines()]
        photos = sum(len(r["paths"]) for r in rows)
        runs = []
        row, full = _run("full build", lambda: build("grocery", [manifest], settings=settings))
        runs.append(row)
        runs.append(
            _run("rebuild, nothing changed", lambda: build("grocery", [manifest], settings=settings))[0]
        )
        time.sleep(2.1)  # files changed within 2 s are always read again (store.version.reuse.RACY_NS)
        for r in rows:
            for p in r["paths"]:
                os.utime(p)
        row, touched = _run(
            "rebuild, every file touched (same bytes)",
            lambda: build("grocery", [manifest], settings=settings),
        )
        runs.append(row)
        rows[0]["title"] = f"{rows[0]['title']} (new recipe)"
        changed_photo = Path(rows[1]["paths"][2])
        with Image.open(changed_photo) as im:
            ImageOps.mirror(im.convert("RGB")).save(changed_photo, format="JPEG", quality=90)
        manifest.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        row, changed = _run(
            "rebuild, 1 title and 1 photo changed", lambda: build("grocery", [manifest], settings=settings)
        )
        runs.append(row)
        row, forced = _run(
            "--force rebuild (the cost before)",
            lambda: build("grocery", [manifest], settings=settings, force=True),
        )
        runs.append(row)
        root = settings.index_root
        a, b = _channels(root, touched.version), _channels(root, full.version)
        c, d = _channels(root, changed.version), _channels(root, forced.version)
        checks = {
            "touched_equals_full_bitwise": a.keys() == b.keys()
            and all(a[k].tobytes() == b[k].tobytes() for k in a),
            "changed_vs_force_max_abs_diff": {k: float(np.abs(c[k] - d[k]).max()) for k in c},
            "channel_files": sorted(a),
        }
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": f"{os.cpu_count()} CPUs (shared)",
        "load_average_1_5_15": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
        "products": len(rows),
        "photos": photos,
        "text_fields": bench.TEXT_FIELDS,
        "runs": runs,
        "checks": checks,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
