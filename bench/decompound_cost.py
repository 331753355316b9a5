"""The CPU cost of decompounding a query (``store.text.decompound``, issue 45), and the splits it makes, on
the
shared grocery catalogue's words.

- Known words: the catalogue's vocabulary (``store.text.spelling.Vocabulary`` of its text values: ``title``,
  ``retailer_title`` and ``description_en`` read as English, ``description_sv`` as Swedish, the fields'
  languages; the built index reads each field's language by detection, so its stems differ a little) and
  each compounding language's wordfreq list (``service.search.dictionaries``, built before timing: the
  service builds it once per process, for typo tolerance too).
- Queries: those of ``bench/compound_queries.py`` and ``bench/products.py`` (608), each read as its own
  language and the catalogue's (en, sv), as the service reads a query it is unsure of; the compounding ones
  among them are split (``Decompounder.reading``), once with every cache empty and once more warm.

    python bench/decompound_cost.py --grocery ../shared/data/grocery \\
        --out bench/results/decompound-cost-DATE.json

Prints JSON; not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service.search.dictionaries import QueryDictionaries  # noqa: E402
from store.text import decompound  # noqa: E402
from store.text.spelling import Vocabulary  # noqa: E402

COMPOUND = REPO / "bench" / "data" / "compound_queries.json"
TYPES = REPO / "bench" / "data" / "grocery_queries.json"
FIELDS = {"title": "en", "retailer_title": "en", "description_en": "en", "description_sv": "sv"}
CATALOGUE_LANGUAGES = ("en", "sv")


def queries() -> list[tuple[str, str]]:
    spec = json.loads(COMPOUND.read_text())
    found = [(q[lang], lang) for q in spec["queries"] for lang in spec["languages"]]
    types = json.loads(TYPES.read_text())
    for kind in ("in_catalogue", "not_sold"):
        found += [(by[lang], lang) for by in types[kind].values() for lang in types["languages"]]
    return found


def summary(seconds: list[float]) -> dict[str, float]:
    us = sorted(1e6 * s for s in seconds)
    return {
        "mean_us": round(statistics.mean(us), 1),
        "p50_us": round(us[len(us) // 2], 1),
        "p95_us": round(us[int(len(us) * 0.95)], 1),
        "max_us": round(us[-1], 1),
    }


def run(grocery: Path) -> dict[str, Any]:
    rows = [json.loads(line) for line in (grocery / "products.jsonl").read_text().splitlines() if line]
    values = [(row[f], lang) for row in rows for f, lang in FIELDS.items() if isinstance(row.get(f), str)]
    vocabulary = Vocabulary.of_texts(values)
    dictionaries = QueryDictionaries(list(decompound.LINKS))
    splitters = {}
    for code in decompound.LINKS:
        found = dictionaries.of(code)
        if found is not None:
            splitters[code] = decompound.Decompounder(code, found.knows, vocabulary)
    asked = queries()
    decompound._analysed.cache_clear()  # every query as first seen: no stem kept from the dictionaries' build

    def once() -> tuple[list[float], dict[str, dict[str, list[str]]]]:
        seconds, splits = [], {}
        for text, lang in asked:
            start = time.process_time()
            got = {}
            for read_as in dict.fromkeys([lang, *CATALOGUE_LANGUAGES]):
                code = decompound.compounding(read_as)
                reading = splitters[code].reading(text) if code in splitters else None
                if reading is not None:
                    got[code] = reading
            seconds.append(time.process_time() - start)
            if got:
                splits[f"{lang}: {text}"] = got
        return seconds, splits

    cold, splits = once()
    warm, _ = once()
    return {
        "vocabulary_words": len(vocabulary),
        "queries": len(asked),
        "cpu_per_query_first_seen": summary(cold),
        "cpu_per_query_warm": summary(warm),
        "split_queries": len(splits),
        "splits": splits,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grocery", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not (args.grocery / "products.jsonl").is_file():
        parser.error(f"--grocery {args.grocery}: no products.jsonl there")
    result = {
        "command": " ".join(["python", *sys.argv]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average": list(os.getloadavg()),
        **run(args.grocery),
    }
    text = json.dumps(result, indent=1, ensure_ascii=False)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
