"""Typo tolerance, measured (issue 43): R-precision of product-type queries with one typo against the same
queries typed right on the shared grocery catalogue, and the CPU typo tolerance adds to lexical search on
synthetic catalogues of 100k products.

Quality (``--grocery DIR``, the shared catalogue's development half; never shipped): the index is built as
``bench/products.py`` builds it (four text fields, the last ``--held-out`` shop photos of every product
left out) and searched through the service (``service.app.create_app`` in process), mode hybrid. Queries:
``bench/data/grocery_queries.json``'s in-catalogue product types in its Latin-script languages; the typo'd
query is made by a seeded program (``add_typo``): one of the query's words of 5+ letters (of a-z: the
keyboard map's) gets one letter replaced by a key next to it on a QWERTY keyboard. Queries without such a
word are left out (the count is reported). Each typo'd query is searched with typo tolerance (the default)
and without (``typos: 0``); the clean one with the default.

Cost (``--scale 100000``): synthetic products of 2 text values of 6 words each from a vocabulary of
pseudo-words of 3-12 letters (Zipf frequencies), written through ``store.products.channels``; per query, this
thread's CPU time of the lexical channel as served (analysis + BM25, best value per product) without and
with typo tolerance (correction + analysis of the corrected query + BM25 with weighted terms), for clean
queries (2-3 vocabulary words: the common case, one look-up per word) and for queries with one typo in a
word of 5+ letters (a fuzzy look-up each); p50 and p99, and the one-off derivation of the vocabulary.
The query-language dictionaries (``service.search.dictionaries``) are those of ``--model``'s languages,
built before the timing with their rarer words' indexes (each one-off build is reported per language), as
the service looks a word up in them when the query's language is uncertain. Pseudo-words are in no
dictionary, so the cost of a real foreign typo is measured apart (``dictionary_lookup``): the grocery
queries' typo'd words of the quality run (seeded alike), each looked up in every dictionary, thread
CPU p50 and p99.

    python bench/typos.py --grocery ../shared/data/grocery --model artifacts/models/ccrk-starter \\
        --scale 100000 --out bench/results/typos-DATE.json

Prints JSON and a table; not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.products import QUERIES, _mean, grocery_settings  # noqa: E402
from bench.products import _manifest as grocery_manifest  # noqa: E402
from service.search.dictionaries import MIN_RARE, QueryDictionaries, nearest_in  # noqa: E402
from service.search.typos import correct_query, edit_budget  # noqa: E402
from store.products.channels import PhotoRows, ProductChannels, ProductInfo, TextRows, write_product_channels  # noqa: E402
from store.products.hybrid import CANDIDATES  # noqa: E402
from store.text.lexical import analyze  # noqa: E402

LATIN = ("en", "sv", "de", "fr", "es", "it", "nl", "pt")
SEED = 43
_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")


def _neighbours() -> dict[str, str]:
    """Each letter's neighbouring keys on a QWERTY keyboard: beside it, and the two touching it in the row
    above (shifted left by half a key) and the row below (shifted right)."""
    where = {(r, i): c for r, row in enumerate(_ROWS) for i, c in enumerate(row)}
    out = {}
    for (r, i), c in where.items():
        spots = [(r, i - 1), (r, i + 1), (r - 1, i), (r - 1, i + 1), (r + 1, i - 1), (r + 1, i)]
        out[c] = "".join(sorted(where[s] for s in spots if s in where))
    return out


NEIGHBOURS = _neighbours()


def add_typo(text: str, rng: np.random.Generator) -> str | None:
    """``text`` with one adjacent-key substitution in one of its words of 5+ letters (a letter of the
    keyboard map, case kept); None where it has no such word."""
    words = [(i, w) for i, w in enumerate(text.split(" ")) if len(w) >= 5 and w.isalpha()]
    spots = [(i, k) for i, w in words for k, c in enumerate(w) if c.lower() in NEIGHBOURS]
    if not spots:
        return None
    i, k = spots[int(rng.integers(len(spots)))]
    parts = text.split(" ")
    c = parts[i][k]
    near = NEIGHBOURS[c.lower()]
    swap = near[int(rng.integers(len(near)))]
    parts[i] = parts[i][:k] + (swap.upper() if c.isupper() else swap) + parts[i][k + 1 :]
    return " ".join(parts)


def _r_precision(ids: list[str], relevant: set[str]) -> float:
    return sum(i in relevant for i in ids[: len(relevant)]) / len(relevant)


def quality(grocery: Path, model: Path, held_out: int, work: Path) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    from indexer.build import build
    from service.app import create_app

    manifest, rows, _ = grocery_manifest(grocery.resolve(), work, held_out)
    types = {r["id"]: r["product_type"] for r in rows}
    spec = json.loads(QUERIES.read_text())
    settings = grocery_settings(model, work)
    build("grocery", [manifest], settings=settings)
    rng = np.random.default_rng(SEED)
    per: dict[str, dict[str, list[float]]] = {
        k: defaultdict(list) for k in ("clean", "clean_off", "typo", "typo_off")
    }
    examples, skipped, corrected = [], 0, 0
    with TestClient(create_app(settings)) as client:

        def ids(query: str, **extra: Any) -> tuple[list[str], dict[str, Any]]:
            body = client.post("/v1/search", json={"query": query, "top_k": 20, **extra}).json()
            return [h["id"] for h in body["results"]], body

        for ptype, by_lang in spec["in_catalogue"].items():
            relevant = {pid for pid, t in types.items() if t == ptype}
            for lang in LATIN:
                clean = by_lang[lang]
                typo = add_typo(clean, rng)
                if typo is None:
                    skipped += 1
                    continue
                got, _ = ids(clean)
                per["clean"][lang].append(_r_precision(got, relevant))
                got, _ = ids(clean, typos=0)
                per["clean_off"][lang].append(_r_precision(got, relevant))
                got, body = ids(typo)
                per["typo"][lang].append(_r_precision(got, relevant))
                corrected += body.get("corrected_query") is not None
                if len(examples) < 40:
                    examples.append(
                        {"lang": lang, "clean": clean, "typo": typo, "corrected": body.get("corrected_query")}
                    )
                got, _ = ids(typo, typos=0)
                per["typo_off"][lang].append(_r_precision(got, relevant))
    out: dict[str, Any] = {
        "queries": sum(len(v) for v in per["clean"].values()),
        "left_out_no_5_letter_word": skipped,
    }
    for kind, by_lang in per.items():
        out[kind] = {
            "mean_r_precision": _mean([x for v in by_lang.values() for x in v]),
            "per_language": {lang: _mean(v) for lang, v in by_lang.items()},
        }
    # Typo'd words are corrected to the catalogue's words: a query in a language it never writes has none
    # to be corrected to (the shared half is written in English and Swedish).
    written = [lang for lang in LATIN if lang in ("en", "sv")]
    for kind, by_lang in per.items():
        out[kind]["catalogue_languages"] = _mean([x for lang in written for x in by_lang[lang]])
        out[kind]["other_languages"] = _mean(
            [x for lang in LATIN if lang not in written for x in by_lang[lang]]
        )
    out["typo_queries_corrected"] = corrected
    out["gap_clean_minus_typo"] = round(out["clean"]["mean_r_precision"] - out["typo"]["mean_r_precision"], 4)
    out["examples"] = examples
    return out


def _pseudo_words(rng: np.random.Generator, n: int) -> list[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    weights = np.array([8, 2, 3, 4, 12, 2, 2, 5, 7, 1, 1, 4, 3, 7, 8, 2, 1, 6, 6, 9, 3, 1, 2, 1, 2, 1], float)
    weights /= weights.sum()
    words: set[str] = set()
    while len(words) < n:
        length = int(rng.integers(3, 13))
        words.add("".join(rng.choice(letters, size=length, p=weights)))
    return sorted(words)


def build_dictionaries(
    languages: list[str],
) -> tuple[QueryDictionaries, dict[str, float], dict[str, float]]:
    """The dictionaries of ``languages``, each built now with its rarer words' index (a one-off, kept out
    of the look-ups' timing): {language: thread CPU seconds of its build}, and of its rarer words'."""
    dictionaries = QueryDictionaries(languages)
    built, rare = {}, {}
    for lang in dictionaries.languages:
        c0 = time.thread_time()
        found = dictionaries.of(lang)
        if found is not None:
            built[lang] = round(time.thread_time() - c0, 3)
            c0 = time.thread_time()
            found.rare_within("x" * MIN_RARE)  # its first use builds it
            rare[lang] = round(time.thread_time() - c0, 3)
    return dictionaries, built, rare


def dictionary_lookup(dictionaries: QueryDictionaries) -> dict[str, Any]:
    """Thread CPU of looking the grocery queries' typo'd words up in every dictionary of their script."""
    spec = json.loads(QUERIES.read_text())
    rng = np.random.default_rng(SEED)
    typed = []
    for by_lang in spec["in_catalogue"].values():
        for lang in LATIN:
            typo = add_typo(by_lang[lang], rng)
            if typo is not None:
                typed += [w for w in typo.casefold().split(" ") if edit_budget(w, 2) and w.isalpha()]
    cpu, corrected = [], 0
    for word in typed:
        c0 = time.thread_time()
        found = dictionaries.for_word(word, list(dictionaries.languages))
        near = nearest_in(word, found, edit_budget(word, 2))
        cpu.append(time.thread_time() - c0)
        corrected += near is not None
    return {
        "words": len(typed),
        "corrected": corrected,
        "languages": list(dictionaries.languages),
        "thread_cpu_ms": {
            "p50": round(1000 * statistics.median(cpu), 4),
            "p99": round(1000 * float(np.quantile(cpu, 0.99)), 4),
        },
    }


def cost(
    products: int, dictionaries: QueryDictionaries, queries: int = 1000, vocab_size: int = 20_000
) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    vocab = _pseudo_words(rng, vocab_size)
    zipf = 1.0 / np.arange(1, vocab_size + 1) ** 1.07
    zipf /= zipf.sum()
    order = rng.permutation(vocab_size)  # frequency unrelated to spelling
    t_owners = np.repeat(np.arange(products), 2).astype(np.int64)
    picks = order[rng.choice(vocab_size, size=(t_owners.size, 6), p=zipf)]
    texts = [" ".join(vocab[w] for w in row) for row in picks]
    dim = 8  # the lexical channel reads no vectors
    vectors = rng.normal(size=(t_owners.size, dim)).astype(np.float32)
    owners = np.arange(products, dtype=np.int64)
    info = ProductInfo(
        fields=["title"], text_languages=["en"], language_counts={"en": len(texts)}, photos=0, texts=0
    )
    out: dict[str, Any] = {"products": products, "texts": len(texts), "vocabulary_words": vocab_size}
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        write_product_channels(
            Path(tmp),
            info,
            PhotoRows(owners, [f"p{i}" for i in range(products)], vectors[::2].copy()),
            TextRows(
                t_owners,
                ["title"] * len(texts),
                ["en"] * len(texts),
                texts,
                [analyze(t, "en") for t in texts],
                vectors,
            ),
        )
        out["write_seconds"] = round(time.perf_counter() - started, 2)
        channels = ProductChannels(Path(tmp), products)
        c0, t0 = time.thread_time(), time.perf_counter()
        vocabulary = channels.vocabulary()
        out["vocabulary_derivation"] = {
            "cpu_s": round(time.thread_time() - c0, 3),
            "wall_s": round(time.perf_counter() - t0, 3),
            "words": len(vocabulary.words),
            "stems": len(vocabulary.stems),
        }
        # Queries of 2-3 words as a shop's are drawn (by frequency), and the same with one typo.
        clean_q = [
            " ".join(vocab[w] for w in order[rng.choice(vocab_size, size=int(rng.integers(2, 4)), p=zipf)])
            for _ in range(queries)
        ]
        typo_q = [t for t in (add_typo(q, rng) for q in clean_q) if t is not None]

        def lexical(text: str, typos: int) -> None:
            correction = correct_query(channels, text, ["en"], typos, dictionaries=dictionaries)
            analysed = text if correction is None else correction.lexical_text
            terms = analyze(analysed, "en")
            channels.lexical(
                terms, CANDIDATES, None, None, None if correction is None else correction.weights()
            )

        cpu: dict[str, list[float]] = defaultdict(list)
        corrected = 0
        for name, qs in (("clean", clean_q), ("typo", typo_q)):
            for i, q in enumerate(qs):
                for typos in (0, 2):
                    c = time.thread_time()
                    lexical(q, typos)
                    if i >= 20:  # warm-up left out
                        cpu[f"{name}_typos_{typos}"].append(time.thread_time() - c)
                if (
                    name == "typo"
                    and correct_query(channels, q, ["en"], 2, dictionaries=dictionaries) is not None
                ):
                    corrected += 1
        channels.close()
    ms = {
        k: {"p50": round(1000 * statistics.median(v), 4), "p99": round(1000 * float(np.quantile(v, 0.99)), 4)}
        for k, v in cpu.items()
    }
    out["thread_cpu_ms"] = ms
    out["typo_queries"] = len(typo_q)
    out["typo_queries_corrected"] = corrected
    out["added_cpu_ms"] = {
        name: {
            "p50": round(ms[f"{name}_typos_2"]["p50"] - ms[f"{name}_typos_0"]["p50"], 4),
            "p99": round(ms[f"{name}_typos_2"]["p99"] - ms[f"{name}_typos_0"]["p99"], 4),
        }
        for name in ("clean", "typo")
    }
    return out


def print_table(result: dict[str, Any]) -> None:
    q = result.get("grocery")
    if q:
        print(
            f"\nGrocery: {q['queries']} product-type queries"
            f" ({q['left_out_no_5_letter_word']} left out: no word of 5+ letters)"
        )
        langs = list(q["clean"]["per_language"])
        print("| queries | " + " | ".join(langs) + " | mean |")
        print("|---" * (len(langs) + 2) + "|")
        for kind in ("clean", "clean_off", "typo", "typo_off"):
            row = [f"{q[kind]['per_language'][lang]:.3f}" for lang in langs]
            print(f"| {kind} | " + " | ".join(row) + f" | {q[kind]['mean_r_precision']:.3f} |")
        for part in ("catalogue_languages", "other_languages"):
            print(
                f"{part}: "
                + ", ".join(f"{k} {q[k][part]:.3f}" for k in ("clean", "clean_off", "typo", "typo_off"))
            )
        print(
            f"clean - typo: {q['gap_clean_minus_typo']:.3f};"
            f" typo'd queries corrected: {q['typo_queries_corrected']}"
        )
    if "dictionary_lookup" in result:
        d = result["dictionary_lookup"]
        print(f"\nDictionaries built (thread CPU s): {result['dictionary_build_cpu_s']}")
        print(f"Their rarer words' indexes (thread CPU s): {result.get('dictionary_rare_build_cpu_s')}")
        print(
            f"{d['words']} typo'd grocery words looked up in {len(d['languages'])} languages' dictionaries:"
            f" {d['corrected']} corrected, thread CPU p50 {d['thread_cpu_ms']['p50']:.3f} ms,"
            f" p99 {d['thread_cpu_ms']['p99']:.3f} ms"
        )
    for c in result.get("cost", []):
        print(
            f"\n{c['products']} products ({c['texts']} text values, {c['vocabulary_words']} words);"
            f" vocabulary derived in {c['vocabulary_derivation']}"
        )
        print("| lexical search, thread CPU ms | p50 | p99 |\n|---|---|---|")
        for k, v in c["thread_cpu_ms"].items():
            print(f"| {k} | {v['p50']:.3f} | {v['p99']:.3f} |")
        for k, v in c["added_cpu_ms"].items():
            print(f"| added by typo tolerance, {k} queries | {v['p50']:.3f} | {v['p99']:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grocery", type=Path)
    parser.add_argument("--model", type=Path, default=REPO / "artifacts" / "models" / "ccrk-starter")
    parser.add_argument("--held-out", type=int, default=4)
    parser.add_argument("--scale", default="")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
    }
    if args.grocery:
        with tempfile.TemporaryDirectory() as tmp:
            result["grocery"] = quality(args.grocery, args.model, args.held_out, Path(tmp))
    if args.scale:
        languages = json.loads((args.model / "config.json").read_text())["languages"]
        dictionaries, built, rare = build_dictionaries(languages)
        result["dictionary_build_cpu_s"] = built
        result["dictionary_rare_build_cpu_s"] = rare
        result["dictionary_lookup"] = dictionary_lookup(dictionaries)
        print(json.dumps(result["dictionary_lookup"]), file=sys.stderr, flush=True)
        result["cost"] = []
        for n in args.scale.split(","):
            result["cost"].append(cost(int(n), dictionaries))
            print(json.dumps(result["cost"][-1]), file=sys.stderr, flush=True)
    text = json.dumps(result, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    print_table(result)


if __name__ == "__main__":
    main()
