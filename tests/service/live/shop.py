"""The live catalogue tests' shop: 30 synthetic products with a title, a category, a price and a stock flag,
built by the real indexer with the shipped demo model."""

from __future__ import annotations

import json
from pathlib import Path

from ccrk_settings import DEFAULT_MODEL_DIR, Settings
from indexer.build import build
from synthetic.synth import SynthConfig, generate_catalogue

PRODUCTS = 30
QUERY = {"query": "a red umbrella", "top_k": 30, "mode": "hybrid"}
BY_PRICE = {**QUERY, "sort": {"field": "price", "order": "asc"}}
EVERY = {"query": "a red umbrella", "top_k": 50, "mode": "hybrid", "min_score": -1.0}  # every product


def _products(catalogue: Path, out: Path) -> Path:
    recs = [json.loads(line) for line in (catalogue / "test.jsonl").read_text().splitlines()]
    rows = [
        {
            "id": f"prod-{i}",
            "path": str(catalogue / recs[i]["image"]),
            "title": recs[i]["captions"]["en"][0],
            "category": recs[i]["attributes"]["category"],
            "price": float(3 * i % 41) + 0.5,
            "in_stock": True,
        }
        for i in range(PRODUCTS)
    ]
    path = out / "products.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def build_shop(tmp: Path, name: str, extra: int = 0) -> Settings:
    """Index ``name`` of the shop under ``tmp/indexes``; the settings it was built with. ``extra``: that
    many more synthetic records in ``tmp/cat`` that the index does not hold (products to add live)."""
    config = SynthConfig(seed=3, n_train=0, n_val=0, n_test=PRODUCTS + extra, image_size=64)
    generate_catalogue(tmp / "cat", config)
    manifest = _products(tmp / "cat", tmp)
    settings = Settings(
        model_dir=DEFAULT_MODEL_DIR,
        backend="onnx",
        device="cpu",
        threads=1,
        index_root=tmp / "indexes",
        index_workers=1,
        index_batch_size=8,
        rerank_policy_queries=0,
        text_fields=["title"],
    )
    build(name, [manifest], settings=settings)
    return settings
