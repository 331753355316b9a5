"""Compound and attribute product queries on the shared grocery catalogue (issue 45): success@3 and MRR per
language, the query's detected language, the match labels' two lines, and the query cost, through the
service in process.

- The catalogue and its index are those of ``bench/products.py`` (the development half, four shop photos of
  every product held out; text fields ``title``, ``retailer_title``, ``description_en``, ``description_sv``),
  built by ``indexer.build.build`` with the model given.
- Queries: ``bench/data/compound_queries.json``, multi-word product names and attributes that the
  catalogue's English text writes ("apple juice", "lactose free milk", "red grapefruit juice"), in twelve
  languages. A query's relevant products are chosen here, by a program, never by hand: those whose one
  English text field (title, retailer title or English description) holds every analysed term of the English
  query (``store.text.lexical.analyze``).
- Also the product-type queries of ``bench/data/grocery_queries.json`` (``bench/products.py``'s): hybrid
  R-precision per language, and the labels' two lines: not-sold types labelled ``none`` (want >= 0.8) and
  in-catalogue types labelled ``none`` (want <= 0.1); compound queries labelled ``none`` too.
- Cost: each query's ``timings_ms`` (search and total, wall) and the process CPU of the whole query loop per
  query (``time.process_time``; the TestClient's own overhead included, the same before and after a change).
- The catalogue prior of the query's language (``service.language.CatalogueLanguages``): each query's
  language detected by the service's detector for the model's languages with and without the built
  version's prior, per language, for the compound and the product-type queries (no HTTP, no search).

    python bench/compound_queries.py --grocery ../shared/data/grocery \\
        --model artifacts/models/ccrk-starter --out bench/results/compound-queries-DATE.json

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
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.products import QUERIES, _manifest, _mean, grocery_settings  # noqa: E402
from store.text.lexical import analyze  # noqa: E402

COMPOUND = REPO / "bench" / "data" / "compound_queries.json"
ENGLISH_FIELDS = ("title", "retailer_title", "description_en")


def relevant_products(rows: list[dict[str, Any]], english: str) -> set[str]:
    """The products one of whose English text fields holds every analysed term of ``english``."""
    terms = set(analyze(english, "en"))
    found = set()
    for row in rows:
        for name in ENGLISH_FIELDS:
            value = row.get(name)
            if isinstance(value, str) and terms <= set(analyze(value, "en")):
                found.add(row["id"])
                break
    return found


def first_relevant(ids: list[str], relevant: set[str]) -> int | None:
    return next((i for i, pid in enumerate(ids) if pid in relevant), None)


def language_prior(
    settings: Any, model: Path, queries: dict[str, list[tuple[str, str]]]
) -> dict[str, dict[str, Any]]:
    """Per query set and language: the share of queries whose language is detected, with the built version's
    catalogue prior (what a search reads) and without it."""
    from service.language import LanguageDetector, catalogue_languages
    from store.version.reader import IndexVersion

    detector = LanguageDetector(json.loads((model / "config.json").read_text())["languages"])
    out: dict[str, dict[str, Any]] = {}
    with IndexVersion.open(settings.index_root, "grocery") as opened:
        catalogue = catalogue_languages(opened.products)
        for name, pairs in queries.items():
            got: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"with": [], "without": []})
            for text, lang in pairs:
                got[lang]["with"].append(float(detector.detect(text, catalogue).code == lang))
                got[lang]["without"].append(float(detector.detect(text).code == lang))
            per = {lang: {k: _mean(v) for k, v in by.items()} for lang, by in got.items()}
            out[name] = {
                "per_language": per,
                "with": _mean([v["with"] for v in per.values()]),
                "without": _mean([v["without"] for v in per.values()]),
            }
    return out


def run(grocery: Path, model: Path, work: Path, held_out: int) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    from indexer.build import build
    from service.app import create_app

    manifest, rows, _ = _manifest(grocery.resolve(), work, held_out)
    settings = grocery_settings(model, work, cache_size=0)
    report = build("grocery", [manifest], settings=settings)
    spec = json.loads(COMPOUND.read_text())
    types_spec = json.loads(QUERIES.read_text())
    types = {r["id"]: r["product_type"] for r in rows}
    per_lang: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    failures: list[dict[str, Any]] = []
    search_ms: list[float] = []
    total_ms: list[float] = []
    skipped = []
    with TestClient(create_app(settings)) as client:

        def ask(query: str) -> dict[str, Any]:
            body = client.post("/v1/search", json={"query": query, "top_k": 10}).json()
            search_ms.append(body["timings_ms"]["search"])
            total_ms.append(body["timings_ms"]["total"])
            return body

        ask("warm up")
        cpu0, n0 = time.process_time(), len(total_ms)
        for entry in spec["queries"]:
            relevant = relevant_products(rows, entry["en"])
            if not relevant:
                skipped.append(entry["en"])
                continue
            for lang in spec["languages"]:
                body = ask(entry[lang])
                ids = [h["id"] for h in body["results"]]
                at = first_relevant(ids, relevant)
                got = per_lang[lang]
                got["success_at_3"].append(float(at is not None and at < 3))
                got["mrr"].append(0.0 if at is None else 1.0 / (at + 1))
                got["language_detected"].append(float(body["language"]["code"] == lang))
                got["labelled_none"].append(float(body.get("match") == "none"))
                if at is None or at >= 3:
                    failures.append(
                        {
                            "query": entry[lang],
                            "lang": lang,
                            "detected": body["language"]["code"],
                            "top3": ids[:3],
                            "first_relevant_rank": at,
                        }
                    )
        types_by_lang: dict[str, list[float]] = defaultdict(list)
        lines: dict[str, list[float]] = {"in_catalogue": [], "not_sold": []}
        for kind in ("in_catalogue", "not_sold"):
            for ptype, by_lang in types_spec[kind].items():
                relevant = {pid for pid, t in types.items() if t == ptype}
                for lang in types_spec["languages"]:
                    body = ask(by_lang[lang])
                    lines[kind].append(float(body.get("match") == "none"))
                    if kind == "in_catalogue":
                        ids = [h["id"] for h in body["results"]]
                        r = len(relevant)
                        types_by_lang[lang].append(sum(i in relevant for i in ids[:r]) / r)
        cpu_per_query_ms = 1000 * (time.process_time() - cpu0) / max(1, len(total_ms) - n0)
    prior = language_prior(
        settings,
        model,
        {
            "compound": [(e[lang], lang) for e in spec["queries"] for lang in spec["languages"]],
            "product_types": [
                (by_lang[lang], lang)
                for kind in ("in_catalogue", "not_sold")
                for by_lang in types_spec[kind].values()
                for lang in types_spec["languages"]
            ],
        },
    )
    languages = spec["languages"]
    summary = {lang: {k: _mean(v) for k, v in per_lang[lang].items()} for lang in languages if per_lang[lang]}
    return {
        "build_notes": report.notes,
        "queries": len(spec["queries"]) - len(skipped),
        "skipped_no_relevant": skipped,
        "compound": {
            "per_language": summary,
            "success_at_3": _mean([v["success_at_3"] for v in summary.values()]),
            "min_success_at_3": min(v["success_at_3"] for v in summary.values()),
            "mrr": _mean([v["mrr"] for v in summary.values()]),
            "language_detected": _mean([v["language_detected"] for v in summary.values()]),
            "labelled_none": _mean([v["labelled_none"] for v in summary.values()]),
        },
        "product_types": {
            "r_precision_per_language": {k: _mean(v) for k, v in types_by_lang.items()},
            "mean_r_precision": _mean([_mean(v) for v in types_by_lang.values()]),
            "not_sold_labelled_none": _mean(lines["not_sold"]),
            "in_catalogue_labelled_none": _mean(lines["in_catalogue"]),
        },
        "language_prior": prior,
        "cost": {
            "search_ms_p50": round(statistics.median(search_ms), 3),
            "total_ms_p50": round(statistics.median(total_ms), 3),
            "process_cpu_ms_per_query": round(cpu_per_query_ms, 3),
            "queries_timed": len(total_ms) - n0,
        },
        "failures": failures,
    }


def print_table(result: dict[str, Any]) -> None:
    compound = result["compound"]
    print(f"{'lang':6} {'s@3':>6} {'MRR':>6} {'lang ok':>8} {'none':>6}")
    for lang, v in compound["per_language"].items():
        print(
            f"{lang:6} {v['success_at_3']:6.3f} {v['mrr']:6.3f} {v['language_detected']:8.3f} "
            f"{v['labelled_none']:6.3f}"
        )
    print(
        f"{'mean':6} {compound['success_at_3']:6.3f} {compound['mrr']:6.3f} "
        f"{compound['language_detected']:8.3f} {compound['labelled_none']:6.3f}"
    )
    types = result["product_types"]
    print(
        f"product types: R-precision {types['mean_r_precision']:.3f}; labelled none: not sold "
        f"{types['not_sold_labelled_none']:.3f}, in catalogue {types['in_catalogue_labelled_none']:.3f}"
    )
    for name, got in result["language_prior"].items():
        print(
            f"language detected, {name}: {got['with']:.3f} with the catalogue prior, "
            f"{got['without']:.3f} without"
        )
    cost = result["cost"]
    print(
        f"cost: search p50 {cost['search_ms_p50']} ms, total p50 {cost['total_ms_p50']} ms, process CPU "
        f"{cost['process_cpu_ms_per_query']} ms per query over {cost['queries_timed']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grocery", type=Path, required=True)
    parser.add_argument("--model", type=Path, default=REPO / "artifacts" / "models" / "ccrk-starter")
    parser.add_argument("--held-out", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not (args.grocery / "products.jsonl").is_file():
        parser.error(f"--grocery {args.grocery}: no products.jsonl there")
    with tempfile.TemporaryDirectory() as tmp:
        result = {
            "command": " ".join(["python", *sys.argv]),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "load_average": list(os.getloadavg()),
            **run(args.grocery, args.model, Path(tmp), args.held_out),
        }
    print(json.dumps(result, indent=1, ensure_ascii=False))
    print_table(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
