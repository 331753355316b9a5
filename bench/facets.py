"""What facets and ``max_per`` add to a search (issue 43): CPU per query of counting 3 facets (two keyword
fields and a numeric one with 3 ranges) over a search's relevant results, at 100k products.

The products' metadata is a real ``metadata.sqlite`` of ``--products`` synthetic items (category from 40,
brand from 400 values, a price, a tag list), read through ``Served.items`` as a search reads it: the row
cache warm (a served version's steady state: its rows were read by earlier searches) and cold (every row
read from SQLite), counted from the version's facet columns (each row's value as a code, read once per
row) and value by value (the path of a field that holds lists). Relevant sets are random rows, of the
sizes a product search keeps: 150 (three channels' 50 candidates each, the default page) and 1,000 (a
deep page). ``max_per`` spreads a 1,000-result list into pages of 20 with at most 2 per brand.

CPU is the calling thread's (``time.thread_time``), per query; p50 and p99 over ``--queries`` draws.

    python bench/facets.py --products 100000 --out bench/results/facets-DATE.json

Prints JSON and a table; not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service.index_holder import Served  # noqa: E402
from service.schemas import FacetSpec, MaxPer  # noqa: E402
from service.search.facets import facet_counts, spread  # noqa: E402
from store.version.metadata import MetadataReader, write_metadata  # noqa: E402

FACETS = [
    FacetSpec(field="category"),
    FacetSpec(field="brand"),
    FacetSpec(field="price", ranges=[[None, 5.0], [5.0, 20.0], [20.0, None]]),
]


class MetadataOnly:
    """What ``Served.items`` reads of an index: its items by row (a version's metadata.sqlite)."""

    def __init__(self, path: Path) -> None:
        self.reader = MetadataReader(path)

    def items(self, rows: list[int]) -> list[dict[str, Any]]:
        found = self.reader.items(rows)
        return [found[r] for r in rows]


def _write(path: Path, n: int, rng: np.random.Generator) -> None:
    categories = [f"category-{i}" for i in range(40)]
    brands = [f"brand-{i}" for i in range(400)]
    tags = ["sale", "new", "organic", "vegan"]
    rows = (
        (
            row,
            f"p{row}",
            None,
            {
                "title": f"product {row}",
                "category": categories[int(rng.integers(40))],
                "brand": brands[int(rng.zipf(1.3)) % 400],
                "price": round(float(rng.lognormal(2.3, 0.8)), 2),
                "tags": [t for t in tags if rng.random() < 0.25],
            },
            False,
        )
        for row in range(n)
    )
    write_metadata(path, rows)


def _percentiles(samples: list[float]) -> dict[str, float]:
    ms = np.asarray(samples) * 1000.0
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


def measure(products: int, queries: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "metadata.sqlite"
        _write(path, products, rng)
        index = MetadataOnly(path)
        out: dict[str, Any] = {}
        for relevant in (150, 1000):
            draws = [rng.choice(products, relevant, replace=False) for _ in range(queries)]
            # "columns": what a search counts from (service.search.facet_columns); "by value": every value
            # read from the row cache and counted in Python (the path of a field holding lists).
            for way, cache in (
                ("columns", "warm"),
                ("by_value", "warm"),
                ("columns", "cold"),
                ("by_value", "cold"),
            ):
                served = Served(index=index)  # type: ignore[arg-type]  # a fresh row cache
                served.item_cache_rows = products
                columns = (served.facet_columns, products) if way == "columns" else None
                if cache == "warm":  # earlier searches read these rows (and their codes)
                    for rows in draws:
                        facet_counts(FACETS, None, lambda _, r=rows: r, served.values_of, rows, columns)
                samples = []
                for rows in draws:
                    if cache == "cold":
                        served._items.clear()
                        served.facet_columns.clear()
                    t0 = time.thread_time()
                    facet_counts(FACETS, None, lambda _, r=rows: r, served.values_of, rows, columns)
                    samples.append(time.thread_time() - t0)
                out[f"facets_3_over_{relevant}_{way}_{cache}"] = _percentiles(samples)
        served = Served(index=index)  # type: ignore[arg-type]
        cap = MaxPer(field="brand", n=2)
        samples = []
        for _ in range(queries):
            rows = rng.choice(products, 1000, replace=False).tolist()
            items = dict(zip(rows, served.items(rows), strict=True))  # what a search has read already
            t0 = time.thread_time()
            spread(rows, lambda r, items=items: items[r].get("brand"), cap, 20, 1000)
            samples.append(time.thread_time() - t0)
        out["max_per_spread_1000_into_pages_of_20"] = _percentiles(samples)
        index.reader.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--products", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = {
        "bench": "facets",
        "command": "python bench/facets.py " + " ".join(sys.argv[1:]),
        "date": datetime.now(UTC).date().isoformat(),
        "products": args.products,
        "queries": args.queries,
        "load_average": os.getloadavg(),
        "cpu_ms": measure(args.products, args.queries, args.seed),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    print("\n| what | p50 ms | p99 ms |\n|---|---|---|")
    for name, value in result["cpu_ms"].items():
        print(f"| {name} | {value['p50_ms']:.3f} | {value['p99_ms']:.3f} |")


if __name__ == "__main__":
    main()
