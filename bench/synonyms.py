"""Synonym expansion (``service.search.synonyms``): what it costs a query, and how the dense query should
combine a query's variants.

    PYTHONPATH=. .venv/bin/python bench/synonyms.py --model artifacts/models/ccrk-starter   # JSON, a table

- Cost: per query, the CPU time (``time.process_time``, one thread) of matching it against a set of
  ``--rules`` entries (``CompiledSynonyms.expand``) and of encoding its variants (``Ranker.encode_text``
  without a cache: what a first search of the query pays), p50 and p99 of each query's fastest of 5 runs,
  beside the original query's own encoding; queries with one match (one variant) and without any.
- Combination: small hand-written shop titles (English, German, French) and synonym pairs whose one term is
  in a title and the other is the query; each query's target title ranked among all titles by the cosine of
  the text embeddings (the dense text channel's score) for: the query alone, the normalised mean of the
  query's and its variant's embeddings (what is served), and the max over the two of their cosines (what a
  search per variant would give). R@1 and mean reciprocal rank.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from model.runtime import load_encoder
from service.search.synonyms import CompiledSynonyms, combined_embedding
from store.synonyms import parse

# (query term, synonym in the title, language): the title says the synonym, the shopper the query term.
PAIRS = [
    ("trainers", "sneakers", "en"),
    ("tee", "t-shirt", "en"),
    ("sofa", "couch", "en"),
    ("jumper", "sweater", "en"),
    ("trousers", "pants", "en"),
    ("mobile phone", "smartphone", "en"),
    ("hoodie", "hooded sweatshirt", "en"),
    ("flip flops", "sandals", "en"),
    ("duvet", "comforter", "en"),
    ("mug", "cup", "en"),
    ("Turnschuhe", "Sneaker", "de"),
    ("Handy", "Smartphone", "de"),
    ("Pulli", "Pullover", "de"),
    ("Sofa", "Couch", "de"),
    ("baskets", "chaussures de sport", "fr"),
    ("portable", "smartphone", "fr"),
    ("canapé", "divan", "fr"),
    ("pull", "chandail", "fr"),
]
TEMPLATES = {
    "en": ["black {} for men", "soft cotton {}", "{} in navy blue"],
    "de": ["schwarze {} für Herren", "{} aus Baumwolle"],
    "fr": ["{} noir pour homme", "{} en coton"],
}
QUERIES = {"en": "{} sale", "de": "{} günstig", "fr": "{} pas cher"}
MISSES = ["red dress", "kitchen knife", "garden chair", "rote Tasse", "lampe de bureau"]


def catalogue() -> tuple[list[str], list[tuple[str, str, int]]]:
    """Titles, and (query, language, target title) per pair."""
    titles, queries = [], []
    for i, (query, synonym, lang) in enumerate(PAIRS):
        template = TEMPLATES[lang][i % len(TEMPLATES[lang])]
        queries.append((QUERIES[lang].format(query), lang, len(titles)))
        titles.append(template.format(synonym))
    titles += ["red dress with belt", "kitchen knife set", "wooden garden chair", "glass vase", "desk lamp"]
    return titles, queries


def rules(count: int) -> dict[str, object]:
    entries: list[dict[str, object]] = [{"terms": [q, s], "lang": lang} for q, s, lang in PAIRS]
    entries += [{"terms": [f"filler{i}a", f"filler{i}b"]} for i in range(max(0, count - len(entries)))]
    return {"synonyms": entries}


def fastest(fn: object, runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.process_time()
        fn()  # type: ignore[operator]
        best = min(best, time.process_time() - t0)
    return best


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=Path("artifacts/models/ccrk-starter"))
    parser.add_argument("--rules", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    encoder = load_encoder(args.model, backend="onnx", device="cpu", threads=1)
    compiled = CompiledSynonyms(parse(rules(args.rules)))
    titles, queries = catalogue()
    title_embeds = encoder.encode_text(titles).embeds

    # Quality of the combinations.
    ranks: dict[str, list[int]] = {"query alone": [], "mean (served)": [], "max over variants": []}
    for query, lang, target in queries:
        expansion = compiled.expand(query, lang)
        assert expansion is not None, query
        embeds = encoder.encode_text([query, *expansion.variants]).embeds
        scores = {
            "query alone": title_embeds @ embeds[0],
            "mean (served)": title_embeds @ combined_embedding(list(embeds)),
            "max over variants": (title_embeds @ embeds.T).max(axis=1),
        }
        for name, s in scores.items():
            ranks[name].append(int((s > s[target]).sum()))
    quality = {
        name: {
            "r_at_1": round(sum(r == 0 for r in rs) / len(rs), 3),
            "mrr": round(statistics.fmean(1.0 / (r + 1) for r in rs), 3),
        }
        for name, rs in ranks.items()
    }

    # Cost per query.
    for lang in compiled.synonyms.rules[0].lang, "de", "fr":  # tables built once, as a server's are
        compiled.table(lang)
    match_s, variants_s, encode_s, miss_s = [], [], [], []
    for query, lang, _ in queries:
        expansion = compiled.expand(query, lang)
        assert expansion is not None
        match_s.append(fastest(lambda q=query, lg=lang: compiled.expand(q, lg)))
        variants_s.append(fastest(lambda v=expansion.variants: [encoder.encode_text([x]) for x in v]))
        encode_s.append(fastest(lambda q=query: encoder.encode_text([q])))
    for query in MISSES:
        miss_s.append(fastest(lambda q=query: compiled.expand(q, "en")))
    cost = {
        "rules": len(compiled.synonyms),
        "queries_matched": len(queries),
        "match_ms_p50": round(pct(match_s, 50), 4),
        "match_ms_p99": round(pct(match_s, 99), 4),
        "match_no_hit_ms_p50": round(pct(miss_s, 50), 4),
        "variant_encode_ms_p50": round(pct(variants_s, 50), 3),
        "variant_encode_ms_p99": round(pct(variants_s, 99), 3),
        "query_encode_ms_p50": round(pct(encode_s, 50), 3),
        "added_share_p50": round(
            statistics.median((m + v) / e for m, v, e in zip(match_s, variants_s, encode_s, strict=True)), 3
        ),
    }
    result = {
        "command": "PYTHONPATH=. python bench/synonyms.py " + " ".join(sys.argv[1:]),
        "model": str(args.model),
        "pairs": len(PAIRS),
        "titles": len(titles),
        "quality": quality,
        "cost": cost,
    }
    text = json.dumps(result, indent=2, ensure_ascii=False)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    print("\n| combination | R@1 | MRR |\n|---|---|---|")
    for name, q in quality.items():
        print(f"| {name} | {q['r_at_1']:.3f} | {q['mrr']:.3f} |")
    print("\n| cost (CPU, one thread) | p50 ms | p99 ms |\n|---|---|---|")
    print(f"| match, {cost['rules']} entries | {cost['match_ms_p50']} | {cost['match_ms_p99']} |")
    print(f"| match, no hit | {cost['match_no_hit_ms_p50']} | - |")
    print(f"| encode the variant | {cost['variant_encode_ms_p50']} | {cost['variant_encode_ms_p99']} |")
    print(f"| encode the query (for scale) | {cost['query_encode_ms_p50']} | - |")


if __name__ == "__main__":
    main()
