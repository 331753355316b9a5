"""Merchandising rules, measured (issue 43): what 50 rules add to a products search, and how often a rule
written in English acts on the same query in the other languages of the grocery bench.

Cost (``--products 100000``): synthetic products as ``bench/products.py`` writes them (3 photos and 2 text
values each, clustered vectors) with a real ``metadata.sqlite`` (brand, price) written by the store; 50
rules, each with a pin, a boost, a bury and a hide (filters on brand and price), written to a real rules
file and read by ``service.search.rules.RuleBook`` as the service reads it. Per query, this thread's CPU
time of what the rules add to ``HybridRanker.text``: ``RuleBook.match`` (the file's ``stat``, one matrix
product), ``with_pins``, ``drop_hidden``, ``reorder`` and ``place`` on the candidates of a real hybrid
gather; p50 and p99, with the rules' thresholds set so that about 2 of the 50 act on a query (``typical``),
and so that all 50 act (``all_act``). The per-version filter masks are built once, before timing (a
served version's first search pays them: one SQLite scan per filter, ``rules_first_search_ms``). The
gather + fusion alone is timed beside it for scale.

Cross-language share (``--model DIR``): the 22 product types of
``bench/data/grocery_queries.json`` (and the not-sold ones, as unrelated queries); for each type a rule is
written for its English query, and the share of its 9 other languages' forms the rule acts on (the cosine
of the two queries' embeddings, by the serving encoder, at least the threshold), per language and for each
threshold; and the share of other types' queries it acts on (false triggers). Read from the encoder as the
service encodes a query (``SearchPipeline.rule_embedding``); ``tests/service/test_rules_grocery.py``
checks the same through the served grocery index.

    python bench/rules.py --products 100000 --model artifacts/models/ccrk-starter \\
        --out bench/results/rules-DATE.json

Prints JSON and a table; not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.products import QUERIES, _synthetic_channels, _synthetic_vectors  # noqa: E402
from service.rule_schemas import RECOMMENDED_THRESHOLD  # noqa: E402
from service.search.rules import RuleBook  # noqa: E402
from store.products.hybrid import CANDIDATES, FusionModel, HybridQuery, gather  # noqa: E402
from store.rules import write_rules  # noqa: E402
from store.version.metadata import MetadataReader, write_metadata  # noqa: E402

RULES = 50
BRANDS = 200
THRESHOLDS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8)


@dataclass
class BenchIndex:
    """What the rules read of a served version, over a real metadata file (``IndexVersion``'s accessors)."""

    path: Path
    meta: MetadataReader
    total_rows: int

    @property
    def fields(self) -> set[str]:
        return self.meta.field_names()

    def filter_rows(self, filters: dict[str, Any]) -> np.ndarray:
        return self.meta.rows_matching(filters, self.fields)

    def row_of(self, item_id: str) -> int | None:
        return self.meta.row_of(item_id)

    def __hash__(self) -> int:  # the rule book keys its filter masks by the version object
        return id(self)


@dataclass
class BenchServed:
    index: BenchIndex


def _rules(rng: np.random.Generator, products: int) -> list[dict[str, Any]]:
    return [
        {
            "id": f"rule-{i}",
            "query": f"rule query {i}",
            "threshold": 0.5,
            "actions": [
                {"pin": f"item-{int(rng.integers(products))}", "position": int(rng.integers(1, 6))},
                {"boost": {"brand": f"b{int(rng.integers(BRANDS))}"}, "weight": 0.3},
                {"bury": {"price": {"gte": float(rng.integers(50, 100))}}, "weight": 0.2},
                {"hide": {"brand": f"b{int(rng.integers(BRANDS))}"}},
            ],
        }
        for i in range(RULES)
    ]


def cost(products: int, queries: int = 300) -> dict[str, Any]:
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # as the service runs its searches: one BLAS thread
        return _cost(products, queries)


def _cost(products: int, queries: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    dim = 512
    vectors = _synthetic_vectors(products, dim, "clustered", rng)
    qs = vectors["queries"][:queries]
    # Rule queries near the catalogue's, as a shop writes them (its own product types).
    rule_vecs = vectors["queries"][queries : queries + RULES]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        version = root / "shop" / "20261201T000000Z-abcdef"
        version.mkdir(parents=True)
        channels = _synthetic_channels(version, vectors, rng)
        write_metadata(
            version / "metadata.sqlite",
            (
                (i, f"item-{i}", None, {"brand": f"b{i % BRANDS}", "price": float(i % 100)}, False)
                for i in range(products)
            ),
        )
        meta = MetadataReader(version / "metadata.sqlite")
        served = BenchServed(BenchIndex(version, meta, products))
        rules = _rules(rng, products)
        embeds = {r["query"]: rule_vecs[i] for i, r in enumerate(rules)}
        model = FusionModel.from_dict(
            {
                "method": "logistic",
                "languages": ["en"],
                "hybrid": {"other": {"weights": [1] * 4}},
                "text": {"other": {"weights": [1] * 3}},
            }
        )
        sims = qs @ rule_vecs.T
        # ~2 of 50 rules acting: each rule's threshold at the 96th percentile of its cosines to the queries.
        typical = np.percentile(sims, 96, axis=0)
        for grouped in (channels.photos, channels.texts):  # steady state: the mapped vectors touched once
            float(np.asarray(grouped.vectors, np.float32).sum())
        out: dict[str, Any] = {
            "products": products,
            "rules": RULES,
            "actions_per_rule": 4,
            "queries": queries,
        }
        for scenario in ("typical", "all_act"):
            for i, rule in enumerate(rules):
                rule["threshold"] = (
                    round(float(min(1.0, max(typical[i], 0.01))), 4) if scenario == "typical" else 0.01
                )
            write_rules(root, "shop", rules)
            book = RuleBook(lambda text, lang: embeds[text])
            if scenario == "all_act":  # every query acts on all 50: cosines shifted up past any threshold
                book.embedding = lambda query, lang: np.full(dim, 1 / np.sqrt(dim), np.float32)  # type: ignore[method-assign]
            t0 = time.perf_counter()
            # Every filter's mask, as a version's first searches build them.
            for rule in book.loaded(served).rules:
                for key, plain in rule.filters.items():
                    book.mask(served, key, plain)
            first_ms = 1000 * (time.perf_counter() - t0)
            added, base, acting = [], [], []
            for n, q in enumerate(qs):
                terms = [f"w{rng.integers(0, 5000)}", f"w{rng.integers(0, 5000)}"]
                c0 = time.thread_time()
                cands = gather(channels, HybridQuery(q, terms), CANDIDATES, None)
                scores = model.score(cands, "hybrid", "other")
                order = np.argsort(-scores, kind="stable")
                c1 = time.thread_time()
                query_embed = q if scenario == "typical" else np.full(dim, 1.0, np.float32)
                acted = book.match(served, query_embed)
                if acted is not None:
                    cands = acted.with_pins(channels, cands, q, None, use_image=True, use_text=True)
                    if cands.rows.size != scores.size:
                        scores = model.score(cands, "hybrid", "other")
                        order = np.argsort(-scores, kind="stable")
                    order = acted.drop_hidden(cands, order)
                    order = acted.reorder(cands, scores, order)
                    acted.place(cands, order.tolist())
                c2 = time.thread_time()
                if n >= 10:
                    base.append(c1 - c0)
                    added.append(c2 - c1)
                    acting.append(0 if acted is None else len(acted.rules))
            out[scenario] = {
                "rules_acting_per_query_mean": round(float(np.mean(acting)), 2),
                "added_cpu_ms_p50": round(1000 * statistics.median(added), 3),
                "added_cpu_ms_p99": round(1000 * float(np.percentile(added, 99)), 3),
                "gather_and_fuse_cpu_ms_p50": round(1000 * statistics.median(base), 3),
                "rules_first_search_ms": round(first_ms, 1),
            }
        meta.close()
        channels.close()
    return out


def cross_language(model: Path) -> dict[str, Any]:
    from model.runtime import load_encoder
    from service.search.query import normalise_query

    encoder = load_encoder(model, backend="onnx", threads=1)
    spec = json.loads(QUERIES.read_text(encoding="utf-8"))
    languages = spec["languages"]
    types = {**spec["in_catalogue"], **spec["not_sold"]}
    keys = [(t, lang) for t, forms in types.items() for lang in languages if lang in forms]
    embeds = encoder.encode_text([normalise_query(types[t][lang]) for t, lang in keys]).embeds
    embeds = embeds / np.linalg.norm(embeds, axis=1, keepdims=True)
    at = {k: i for i, k in enumerate(keys)}
    same: dict[str, list[float]] = {lang: [] for lang in languages if lang != "en"}
    other: list[float] = []
    for t in spec["in_catalogue"]:  # rules for the product types the shop sells
        rule = embeds[at[(t, "en")]]
        for (t2, lang), i in at.items():
            cos = float(embeds[i] @ rule)
            if t2 == t and lang != "en":
                same[lang].append(cos)
            elif t2 != t:
                other.append(cos)
    every = [c for values in same.values() for c in values]
    return {
        "model": model.name,
        "rules": len(spec["in_catalogue"]),
        "forms_per_rule": len(same),
        "by_threshold": {
            str(th): {
                "acts_on_same_query_other_languages": round(float(np.mean(np.asarray(every) >= th)), 4),
                "acts_on_other_queries": round(float(np.mean(np.asarray(other) >= th)), 4),
                "per_language": {
                    lang: round(float(np.mean(np.asarray(v) >= th)), 3) for lang, v in same.items()
                },
            }
            for th in THRESHOLDS
        },
        "recommended_threshold": RECOMMENDED_THRESHOLD,
        "other_queries": len(other),
    }


def print_table(result: dict[str, Any]) -> None:
    if "cost" in result:
        c = result["cost"]
        print(
            f"\n{c['products']} products, {c['rules']} rules x {c['actions_per_rule']} actions "
            "(thread CPU, ms)"
        )
        print(f"{'scenario':<10} {'acting':>7} {'added p50':>10} {'added p99':>10} {'gather+fuse p50':>16}")
        for name in ("typical", "all_act"):
            s = c[name]
            print(
                f"{name:<10} {s['rules_acting_per_query_mean']:>7} {s['added_cpu_ms_p50']:>10} "
                f"{s['added_cpu_ms_p99']:>10} {s['gather_and_fuse_cpu_ms_p50']:>16}"
            )
    if "cross_language" in result:
        x = result["cross_language"]
        langs = list(next(iter(x["by_threshold"].values()))["per_language"])
        print(
            f"\nEnglish rule acting on the same query in {x['forms_per_rule']} other languages ({x['model']})"
        )
        print(f"{'threshold':>9} {'same':>6} {'other':>6} " + " ".join(f"{lang:>5}" for lang in langs))
        for th, row in x["by_threshold"].items():
            per = " ".join(f"{row['per_language'][lang]:>5}" for lang in langs)
            print(
                f"{th:>9} {row['acts_on_same_query_other_languages']:>6} "
                f"{row['acts_on_other_queries']:>6} {per}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--products", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--model", type=Path, help="the serving model (e.g. artifacts/models/ccrk-starter)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result: dict[str, Any] = {
        "command": "python bench/rules.py " + " ".join(sys.argv[1:]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if args.products:
        result["cost"] = cost(args.products, args.queries)
    if args.model is not None:
        result["cross_language"] = cross_language(args.model)
    print(json.dumps(result, indent=1, ensure_ascii=False))
    print_table(result)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
